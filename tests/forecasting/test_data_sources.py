"""Loading projects from synthetic, csv/parquet files, directories, globs and shards."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpufill.forecasting.data import Project, load_projects, synthetic_projects
from gpufill.errors import InputError


def _write(path, **columns) -> None:
    frame = pd.DataFrame(columns)
    if path.suffix == ".parquet":
        frame.to_parquet(path, engine="pyarrow", index=False)
    else:
        frame.to_csv(path, index=False)


def _error(source, **kwargs) -> str:
    with pytest.raises(InputError) as err:
        load_projects(str(source), **kwargs)
    message = str(err.value)
    assert "\n" not in message and "; fix: " in message
    return message


# --- sources and layouts ----------------------------------------------------------------------


def test_synthetic_source_matches_generator_and_restricts():
    loaded = load_projects("synthetic", n_projects=4, length=300, seed=3, projects=["p002", "p000"])
    assert list(loaded) == ["p000", "p002"]  # ordered by name
    np.testing.assert_array_equal(loaded["p002"].target, synthetic_projects(4, 300, 3)["p002"].target)


def test_directory_one_file_per_project(tmp_path):
    _write(tmp_path / "b.csv", target=[1.0, 2.0, 3.0], x=[4, 5, 6], label=["u", "v", "w"], y=[0.5, 0.5, 0.5])
    _write(tmp_path / "a.parquet", target=[7.0, 8.0], z=[1.0, 2.0])
    (tmp_path / "notes.txt").write_text("ignored: not a data file")
    loaded = load_projects(str(tmp_path))
    assert list(loaded) == ["a", "b"]
    b = loaded["b"]
    assert isinstance(b, Project) and b.source == str(tmp_path / "b.csv") and b.time is None
    np.testing.assert_array_equal(b.target, [1.0, 2.0, 3.0])
    assert b.covariate_names == ("x", "y")  # numeric columns in file order; text column ignored
    np.testing.assert_array_equal(b.covariates, [[4, 0.5], [5, 0.5], [6, 0.5]])
    assert b.covariates.dtype == np.float64 and b.length == 3
    np.testing.assert_array_equal(loaded["a"].covariates, [[1.0], [2.0]])


def test_single_file_and_glob(tmp_path):
    _write(tmp_path / "one.csv", sales=[1.0, 2.0])
    _write(tmp_path / "two.csv", sales=[3.0, 4.0])
    _write(tmp_path / "three.parquet", sales=[5.0, 6.0])
    assert list(load_projects(str(tmp_path / "one.csv"), target="sales")) == ["one"]
    assert list(load_projects(str(tmp_path / "*.csv"), target="sales")) == ["one", "two"]
    assert list(load_projects(str(tmp_path / "t*"), target="sales")) == ["three", "two"]


def test_project_column_layout(tmp_path):
    _write(
        tmp_path / "all.csv",
        project=["b", "a", "b", "a", "b"],
        target=[1.0, 10.0, 2.0, 20.0, 3.0],
        price=[0.1, 0.2, 0.3, 0.4, 0.5],
    )
    loaded = load_projects(str(tmp_path / "all.csv"))
    assert list(loaded) == ["a", "b"]
    np.testing.assert_array_equal(loaded["a"].target, [10.0, 20.0])
    np.testing.assert_array_equal(loaded["b"].target, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(loaded["b"].covariates[:, 0], [0.1, 0.3, 0.5])
    assert loaded["a"].covariate_names == ("price",)  # the project column is not a covariate
    assert list(load_projects(str(tmp_path / "all.csv"), projects="b")) == ["b"]  # a lone name


def test_custom_project_column_with_numeric_names(tmp_path):
    _write(tmp_path / "all.parquet", client=[7, 7, 3], target=[1.0, 2.0, 3.0])
    loaded = load_projects(str(tmp_path / "all.parquet"), project_column="client")
    assert list(loaded) == ["3", "7"] and loaded["7"].covariate_names == ()


def test_time_column_sorts_rows(tmp_path):
    _write(tmp_path / "s.csv", date=["2024-01-03", "2024-01-01", "2024-01-02"], target=[3.0, 1.0, 2.0], x=[30, 10, 20])
    p = load_projects(str(tmp_path / "s.csv"))["s"]
    np.testing.assert_array_equal(p.target, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(p.covariates[:, 0], [10, 20, 30])
    assert p.covariate_names == ("x",)
    assert p.time.dtype.kind == "M"
    np.testing.assert_array_equal(p.time, np.array(["2024-01-01", "2024-01-02", "2024-01-03"], dtype="datetime64[ns]"))


def test_explicit_numeric_time_column(tmp_path):
    _write(tmp_path / "s.csv", step=[2, 0, 1], target=[3.0, 1.0, 2.0], other=[9.0, 8.0, 7.0])
    p = load_projects(str(tmp_path / "s.csv"), time_column="step")["s"]
    np.testing.assert_array_equal(p.target, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(p.time, [0, 1, 2])
    assert p.covariate_names == ("other",)  # the time column is not a covariate


def test_timezone_aware_times_become_naive_utc(tmp_path):
    _write(tmp_path / "s.csv", timestamp=["2024-01-01T02:00:00+02:00", "2024-01-01T00:30:00+00:00"], target=[1.0, 2.0])
    p = load_projects(str(tmp_path / "s.csv"))["s"]
    np.testing.assert_array_equal(p.target, [1.0, 2.0])  # 00:00 UTC before 00:30 UTC
    np.testing.assert_array_equal(p.time, np.array(["2024-01-01T00:00", "2024-01-01T00:30"], dtype="datetime64[ns]"))


def test_shards_merge_in_numeric_order(tmp_path):
    for part in range(1, 12):  # lexicographic order would put part10, part11 before part2
        _write(tmp_path / f"sales_part{part}.csv", target=[float(part), float(part) + 0.5])
    _write(tmp_path / "other.csv", target=[1.0])
    loaded = load_projects(str(tmp_path))
    assert list(loaded) == ["other", "sales"]
    expected = np.array([[p, p + 0.5] for p in range(1, 12)], dtype=float).ravel()
    np.testing.assert_array_equal(loaded["sales"].target, expected)
    assert loaded["sales"].source == str(tmp_path / "sales_part{1..11}.csv")


def test_shards_with_project_column(tmp_path):
    _write(tmp_path / "all_part2.parquet", project=["a", "b"], target=[2.0, 20.0])
    _write(tmp_path / "all_part1.parquet", project=["a", "b"], target=[1.0, 10.0])
    loaded = load_projects(str(tmp_path))
    np.testing.assert_array_equal(loaded["a"].target, [1.0, 2.0])
    np.testing.assert_array_equal(loaded["b"].target, [10.0, 20.0])


@pytest.mark.parametrize(
    "fill, target, covariate",
    [
        ("ffill", [1.0, 1.0, 1.0, 3.0, 3.0], [5.0, 5.0, 6.0, 6.0, 6.0]),  # leading NaN back-filled
        ("interpolate", [1.0, 1.0, 2.0, 3.0, 3.0], [5.0, 5.5, 6.0, 6.0, 6.0]),
        ("zero", [0.0, 1.0, 0.0, 3.0, 0.0], [5.0, 0.0, 6.0, 0.0, 0.0]),
    ],
)
def test_fill_options(tmp_path, fill, target, covariate):
    nan = float("nan")
    _write(tmp_path / "s.csv", target=[nan, 1.0, nan, 3.0, nan], x=[5.0, nan, 6.0, nan, nan])
    p = load_projects(str(tmp_path / "s.csv"), fill=fill)["s"]
    np.testing.assert_array_equal(p.target, target)
    np.testing.assert_array_equal(p.covariates[:, 0], covariate)


def test_fill_follows_time_order(tmp_path):
    _write(tmp_path / "s.csv", time=[3, 1, 2], target=[float("nan"), 1.0, 2.0])
    p = load_projects(str(tmp_path / "s.csv"), fill="ffill")["s"]
    np.testing.assert_array_equal(p.target, [1.0, 2.0, 2.0])


# --- errors -----------------------------------------------------------------------------------


def test_unknown_fill():
    message = _error("synthetic", fill="mean")
    assert message == "load_projects: fill: unknown fill 'mean'; fix: set fill to one of none, ffill, interpolate, zero"


def test_unknown_source_string():
    message = _error("m4:hourly")
    assert message.startswith("m4:hourly: source: unknown source")
    assert "fix: set source to 'synthetic', a .csv or .parquet file, a directory of them, or a glob" in message


def test_missing_file(tmp_path):
    message = _error(tmp_path / "nope.parquet")
    assert message.startswith(f"{tmp_path / 'nope.parquet'}: source: no such file; fix: check the path")


def test_glob_matches_nothing(tmp_path):
    message = _error(tmp_path / "*.csv")
    assert message.startswith(f"{tmp_path / '*.csv'}: source: glob pattern matches no files; fix: check the pattern")


def test_unsupported_extension(tmp_path):
    (tmp_path / "data.xlsx").write_bytes(b"PK")
    message = _error(tmp_path / "data.xlsx")
    assert "source: unsupported file type '.xlsx' (data.xlsx)" in message
    assert "fix: convert the data to .csv or .parquet" in message
    assert "unsupported file type '.xlsx'" in _error(tmp_path / "*.xlsx")


def test_directory_without_data_files(tmp_path):
    (tmp_path / "readme.md").write_text("no data")
    message = _error(tmp_path)
    assert message.startswith(f"{tmp_path}: source: directory holds no .csv or .parquet files; fix:")


def test_missing_target_column_lists_columns(tmp_path):
    _write(tmp_path / "s.csv", sales=[1.0], price=[2.0])
    message = _error(tmp_path / "s.csv")
    assert message == (
        f"{tmp_path / 's.csv'}: target: no target column 'target'; columns present: sales, price; "
        "fix: pass target=<one of those columns>"
    )


def test_empty_file(tmp_path):
    (tmp_path / "s.csv").write_text("")
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: file is empty; fix:")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_file_without_rows(tmp_path, suffix):
    _write(tmp_path / f"s{suffix}", target=pd.Series([], dtype=float))
    message = _error(tmp_path / f"s{suffix}")
    assert message.startswith(f"{tmp_path / f's{suffix}'}: file has columns ['target'] but no rows; fix: add data rows")


def test_corrupt_parquet(tmp_path):
    (tmp_path / "s.parquet").write_bytes(b"\x00\x01garbage, not parquet\xff" * 10)
    message = _error(tmp_path / "s.parquet")
    assert message.startswith(f"{tmp_path / 's.parquet'}: cannot read file (")
    assert "fix: check that it is a valid parquet file" in message


def test_csv_with_garbage_bytes(tmp_path):
    (tmp_path / "s.csv").write_bytes(b"target\n1.0\n\xff\xfe\xe8\x81 not utf-8\n")
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: cannot read file (UnicodeDecodeError:")
    assert "fix: check that it is a valid csv file" in message


def test_nan_without_fill_names_column_and_count(tmp_path):
    _write(tmp_path / "s.csv", target=[1.0, None, None, 4.0], x=[1.0, 2.0, None, 4.0])
    message = _error(tmp_path / "s.csv")
    assert message == (
        f"{tmp_path / 's.csv'}: target: missing values (NaN): 2 in 'target', 1 in 'x'; "
        "fix: clean the data, or set fill to ffill, interpolate or zero"
    )


def test_nan_in_a_project_of_a_multi_project_file(tmp_path):
    _write(tmp_path / "all.csv", project=["a", "b"], target=[1.0, 2.0], x=[None, 1.0])
    message = _error(tmp_path / "all.csv")
    assert message.startswith(f"{tmp_path / 'all.csv'} (project a): x: missing values (NaN): 1 in 'x'")


def test_non_numeric_target(tmp_path):
    _write(tmp_path / "s.csv", target=["1.5", "lots", "3"])
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: target: target column is not numeric (dtype ")
    assert "e.g. 'lots'" in message and "fix: point target= at a numeric column" in message


def test_column_with_no_values_cannot_be_filled(tmp_path):
    _write(tmp_path / "s.csv", target=[1.0, 2.0], x=[None, None])
    message = _error(tmp_path / "s.csv", fill="ffill")
    assert message.startswith(f"{tmp_path / 's.csv'}: x: column 'x' has no values at all")
    assert "fix: remove the column" in message


def test_infinite_values(tmp_path):
    _write(tmp_path / "s.csv", target=[1.0, float("inf"), 3.0])
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: target: 1 infinite values in column 'target' (the first at line 3); fix: replace")


def test_shard_gap_names_missing_part(tmp_path):
    for part in (1, 3, 4):
        _write(tmp_path / f"sales_part{part}.csv", target=[1.0])
    message = _error(tmp_path)
    missing = tmp_path / "sales_part2.csv"
    assert message.startswith(f"{tmp_path / 'sales_part1.csv'}: source: gap in shard numbering: missing {missing};")
    assert "fix: add the missing shard(s) or renumber sales_partN" in message


def test_shards_must_start_at_part1(tmp_path):
    for part in (2, 3):
        _write(tmp_path / f"sales_part{part}.parquet", target=[1.0])
    message = _error(tmp_path)
    assert f"shard numbering must start at part1: missing {tmp_path / 'sales_part1.parquet'}" in message


def test_shards_with_different_columns(tmp_path):
    _write(tmp_path / "s_part1.csv", target=[1.0], x=[1.0])
    _write(tmp_path / "s_part2.csv", target=[1.0], y=[1.0])
    message = _error(tmp_path)
    assert message.startswith(f"{tmp_path / 's_part2.csv'}: columns: columns ['target', 'y'] differ from s_part1.csv's")


def test_project_in_two_files(tmp_path):
    _write(tmp_path / "s.csv", target=[1.0])
    _write(tmp_path / "s_part1.csv", target=[1.0])
    message = _error(tmp_path)
    assert message.startswith(f"{tmp_path}: source: several files hold project 's'")
    assert "fix: keep one file per project" in message


def test_same_project_from_two_multi_project_files(tmp_path):
    _write(tmp_path / "x.csv", project=["a"], target=[1.0])
    _write(tmp_path / "y.csv", project=["a"], target=[1.0])
    message = _error(tmp_path)
    first = tmp_path / "x.csv"
    assert message.startswith(f"{tmp_path / 'y.csv'}: project: project 'a' appears both here and in {first}")


def test_rows_without_project_name(tmp_path):
    _write(tmp_path / "all.csv", project=["a", None], target=[1.0, 2.0])
    message = _error(tmp_path / "all.csv")
    assert message.startswith(f"{tmp_path / 'all.csv'}: project: 1 rows have no project name (the first at line 3); fix: fill in 'project'")


def test_unknown_project_lists_available(tmp_path):
    message = _error("synthetic", n_projects=8, length=50, projects=["p001", "zzz"])
    assert message.startswith(
        "synthetic: projects: unknown project(s) 'zzz'; available: p000, p001, p002, p003, p004, ... (8 in all)"
    )
    assert "fix: pick names from the available projects" in message
    assert "no project names given" in _error("synthetic", length=50, projects=[])


def test_missing_time_column(tmp_path):
    _write(tmp_path / "s.csv", target=[1.0])
    message = _error(tmp_path / "s.csv", time_column="when")
    assert message.startswith(f"{tmp_path / 's.csv'}: time_column: no time column 'when'; columns present: target")
    assert "fix: pass time_column=<one of those columns>, or time_column=None" in message


def test_unparseable_time_column(tmp_path):
    _write(tmp_path / "s.csv", date=["2024-01-01", "not a date"], target=[1.0, 2.0])
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: date: cannot parse time values as dates")
    assert "fix: write 'date' in one date format" in message


def test_missing_time_values(tmp_path):
    _write(tmp_path / "s.csv", time=[1.0, None], target=[1.0, 2.0])
    message = _error(tmp_path / "s.csv")
    assert message.startswith(f"{tmp_path / 's.csv'}: time: 1 rows have no time value; fix: fill in 'time'")


def test_a_text_column_holding_several_series_is_an_error_naming_it(tmp_path):
    """Five stores stacked in one file without project_column: refused, not read as one mixed series."""
    t = np.arange(120)
    frame = pd.concat([pd.DataFrame({"store": name, "time": t, "target": np.sin(t / 5) + i}) for i, name in enumerate("abcde")])
    frame.to_csv(tmp_path / "stores.csv", index=False)
    with pytest.raises(InputError) as info:
        load_projects(str(tmp_path / "stores.csv"))
    assert info.value.field == "project_column"
    assert "column 'store' looks like a project id (5 text values, about 120 rows each)" in str(info.value)
    assert "set data.project_column: store" in str(info.value)
    by_store = load_projects(str(tmp_path / "stores.csv"), project_column="store")
    assert sorted(by_store) == list("abcde") and all(p.length == 120 for p in by_store.values())
    frame.sample(frac=1.0, random_state=0).to_csv(tmp_path / "shuffled.csv", index=False)  # rows interleaved: the repeating stamps tell
    with pytest.raises(InputError, match="'store' looks like a project id"):
        load_projects(str(tmp_path / "shuffled.csv"))


def test_a_cycling_text_covariate_is_not_taken_for_a_project_id(tmp_path):
    t = np.arange(140)
    weekdays = np.array(["mon", "tue", "wed", "thu", "fri", "sat", "sun"])[t % 7]
    pd.DataFrame({"time": t, "target": np.sin(t / 5), "weekday": weekdays}).to_csv(tmp_path / "one.csv", index=False)
    (project,) = load_projects(str(tmp_path / "one.csv")).values()
    assert project.length == 140 and project.covariate_names == ()  # text columns are not covariates
