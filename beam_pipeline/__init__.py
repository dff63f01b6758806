"""img2tfrecord: options, pipeline assembly and entry points.

Importing the package changes no process-wide state (tests/cli/test_startup.py); the CLI's
process set-up is beam_pipeline/cli/startup.py, which only the console entry calls.
"""

__all__ = ["load_dataset", "parse_spec"]


def __getattr__(name: str):
    """`load_dataset` and `parse_spec` (readers/dataset.py), imported when first asked for."""
    if name in __all__:
        from beam_pipeline.readers import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
