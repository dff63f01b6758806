"""Box columns of a labels table as rows: batches parsed by pyarrow from real CSV and JSON
Lines files in tmp_path (as the table reader hands them over), converted a batch at a time."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pytest

from transforms.labels.annotations.box_table import (
    BoxRows,
    BoxTable,
    normalize_key_column,
    parse_box_columns,
)
from transforms.labels.annotations.rows import NAMES, is_normalized
from transforms.labels.table import normalize_key

OPEN_IMAGES = BoxTable("ImageID", "LabelName", ("XMin", "YMin", "XMax", "YMax"), "normalized")


def _csv(path) -> pa.RecordBatch:
    """A CSV's cells as text, as labels/table.py has pyarrow read them."""
    header = path.read_text().splitlines()[0].split(",")
    table = pacsv.read_csv(
        path, convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string()))
    )
    return table.combine_chunks().to_batches()[0]


def _plain(batch: pa.RecordBatch) -> list[dict]:
    return [{k: v for k, v in row.items() if v is not None} for row in batch.to_pylist()]


def test_open_images_boxes_one_row_a_box_in_table_order(tmp_path):
    (tmp_path / "boxes.csv").write_text(
        "ImageID,Source,LabelName,Confidence,XMin,XMax,YMin,YMax\n"
        "000002b66c9c498e,xclick,/m/01g317,1,0.012500,0.195312,0.148438,0.587500\n"
        "000002b66c9c498e,xclick,/m/0284d,1, 0.25 ,0.5,0.25,.75\n"
        "000002b97e5471a0,xclick,/m/05s2s,1,0,1,1e-1,1.0\n"
    )
    out = BoxRows(OPEN_IMAGES)(_csv(tmp_path / "boxes.csv"), "boxes.csv", [2, 3, 4])
    assert out.schema.names == list(NAMES) and is_normalized(out)
    flags = {"is_crowd": False, "difficult": False, "truncated": False, "source": "boxes.csv"}
    assert _plain(out) == [
        {"key": "000002b66c9c498e", "label": "/m/01g317", "xmin": 0.0125, "ymin": 0.148438, "xmax": 0.195312,
         "ymax": 0.5875, "line": 2, **flags},
        {"key": "000002b66c9c498e", "label": "/m/0284d", "xmin": 0.25, "ymin": 0.25, "xmax": 0.5, "ymax": 0.75,
         "line": 3, **flags},
        {"key": "000002b97e5471a0", "label": "/m/05s2s", "xmin": 0.0, "ymin": 0.1, "xmax": 1.0, "ymax": 1.0,
         "line": 4, **flags},
    ]  # fmt: skip


def test_pixels_from_json_lines_numbers(tmp_path):
    (tmp_path / "boxes.jsonl").write_text(
        '{"id": "a", "label": "cat", "x0": 1, "y0": 2.5, "x1": 30, "y1": 40}\n'
        '{"id": "b", "label": "dog", "x0": 0, "y0": 0, "x1": 8, "y1": null}\n'
    )
    cells = pajson.read_json(tmp_path / "boxes.jsonl").to_batches()[0]
    spec = BoxTable("id", "label", ("x0", "y0", "x1", "y1"))
    out = BoxRows(spec)(cells, "boxes.jsonl", pa.array([1, 2]))
    assert not is_normalized(out)
    got = _plain(out)
    assert (got[0]["xmin"], got[0]["ymin"], got[0]["xmax"], got[0]["ymax"]) == (1.0, 2.5, 30.0, 40.0)
    assert got[1]["error"] == "line 2: column 'y1': None is not a finite number"


@pytest.mark.parametrize(
    "line, message, key",
    [
        (",cat,1,2,3,4", "line 2: no value in key column 'id'", None),
        ("a,,1,2,3,4", "line 2: column 'label': the class name is empty", "a"),
        ("a,cat,x,2,3,4", "line 2: column 'x0': 'x' is not a finite number", "a"),
        ("a,cat,1,,3,4", "line 2: column 'y0': '' is not a finite number", "a"),
        ("a,cat,1,2,nan,4", "line 2: column 'x1': 'nan' is not a finite number", "a"),
        ("a,cat,1,2,3,inf", "line 2: column 'y1': 'inf' is not a finite number", "a"),
        ("a,cat,1,2,3,1e999", "line 2: column 'y1': '1e999' is not a finite number", "a"),
        ('a,"ca\tt",1,2,3,4', "contains a control character", "a"),
    ],
)
def test_a_bad_row_is_a_named_failure_row(tmp_path, line, message, key):
    (tmp_path / "t.csv").write_text(f"id,label,x0,y0,x1,y1\n{line}\nok,cat,1,2,3,4\n")
    spec = BoxTable("id", "label", ("x0", "y0", "x1", "y1"))
    bad, good = _plain(BoxRows(spec)(_csv(tmp_path / "t.csv"), "t.csv", [2, 3]))
    assert bad["error"] == message or message in bad["error"], bad
    assert bad.get("key") == key and bad["line"] == 2
    assert "error" not in good and good["xmax"] == 3.0


def test_keys_are_normalised_exactly_as_the_table_reader_normalises_them():
    keys = ["  a/b.jpg ", "./x", "././y", "/abs/z", "//two", "./ /k", "e\u0301", "dir\\win.png", "", "ok"]
    assert normalize_key_column(pa.array(keys)).to_pylist() == [normalize_key(k) for k in keys]


def test_parse_box_columns():
    assert parse_box_columns(" XMin, YMin ,XMax,YMax") == ("XMin", "YMin", "XMax", "YMax")
    for bad in ("a,b,c", "a,b,c,d,e", "a,b,,d", "a,b,a,d"):
        with pytest.raises(ValueError, match="--box_columns"):
            parse_box_columns(bad)


def test_label_names_are_checked_once_per_distinct_cell_across_batches(tmp_path):
    (tmp_path / "t.csv").write_text("id,label,x0,y0,x1,y1\na,cat,1,2,3,4\nb,dog,1,2,3,4\nc,cat,1,2,3,4\n")
    convert = BoxRows(BoxTable("id", "label", ("x0", "y0", "x1", "y1")))
    for _ in range(2):
        out = convert(_csv(tmp_path / "t.csv"), "t.csv", [2, 3, 4])
        assert out["label"].to_pylist() == ["cat", "dog", "cat"] and out["error"].null_count == 3
    assert sorted(convert._names) == ["cat", "dog"]


def test_an_empty_batch_gives_no_rows():
    cells = pa.RecordBatch.from_pydict(
        {c: pa.array([], pa.string()) for c in ("id", "label", "a", "b", "c", "d")}
    )
    out = BoxRows(BoxTable("id", "label", ("a", "b", "c", "d")))(cells, "t.csv", pa.array([], pa.int64()))
    assert out.num_rows == 0 and out.schema.names == list(NAMES)
