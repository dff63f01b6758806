"""readers: a written dataset read back (load_dataset, verify, inspect), from its output
folder alone (local or gs://)."""
