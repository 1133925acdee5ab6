"""``hpcopt collect``: one row per run with its state, the options that differ and its final
figures, in ``study.csv`` (read back by the csv module) and ``study.md``; states from task
records and their locks; damaged traces become notes; 100 runs in seconds."""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import time
from pathlib import Path

import pytest

from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import Trace
from hpcopt.report import read_each
from hpcopt.run import progress
from hpcopt.study import collect, layout
from tests.command_line import assert_one_line_error, launch
from tests.crafted import truncated_trace
from tests.runs import fresh_train
from tests.timeouts import scaled


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Three finished 1-rank runs: intervals 2 and 4, and interval 4 with a network profile."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, extra in (("I2", {"interval": "2"}), ("I4", {"interval": "4"}),
                        ("I4-eth", {"interval": "4", "network": "eth10"})):
        out = root / name
        fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": "8", "eval_every": "4",
                                        "progress": "false", "out": str(out), **extra}))
        made[name] = out
    return made


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_one_row_per_run_with_the_options_that_differ(runs, tmp_path):
    written = collect.collect([runs["I2"], runs["I4"], runs["I4-eth"]], tmp_path / "out")
    assert [p.name for p in written] == ["study.csv", "study.md"]
    rows = read_csv(tmp_path / "out" / "study.csv")
    header = list(rows[0])
    assert header[:4] == ["run", "state", "exit_code", "interval"]  # network tells nothing about the results
    assert header[-4:] == ["modelled_comm_seconds", "network", "checkpoint", "note"]
    assert [row["interval"] for row in rows] == ["2", "4", "4"]
    assert [row["state"] for row in rows] == ["finished"] * 3 and all(not row["note"] for row in rows)
    assert [row["exit_code"] for row in rows] == [""] * 3  # runs outside a study: no task record
    for row, name in zip(rows, ("I2", "I4", "I4-eth")):
        trace = read_each([runs[name] / "trace.h5"])[0]
        assert isinstance(trace, Trace)
        assert trace.attrs["comm_progress"] == "calls"  # MPICH's progress thread is off here
        assert row["run"] == str(runs[name])  # outside --out: as given
        assert int(row["steps"]) == 8 and int(row["rounds"]) == 8 // int(row["interval"])
        assert float(row["eval_accuracy"]) == trace.summary["eval_accuracy"]
        assert float(row["train_loss"]) == trace.columns["loss_mean"][-1]
        assert int(row["bytes"]) == trace.bytes_total()[-1]
        assert int(row["bytes_average"]) == trace.comm["average"]["bytes"][-1]
        # one rank: its communicator is within its node, so every byte stayed there
        assert (int(row["in_node_bytes"]), int(row["across_nodes_bytes"])) == (int(row["bytes"]), 0)
        assert float(row["wall_seconds"]) == trace.summary["wall"]
        assert row["checkpoint"] == str(runs[name] / "checkpoints" / "step-000000008.h5")
    # modelled only where --network was set (0 at one rank: nothing crosses ranks)
    assert rows[0]["modelled_comm_seconds"] == "" and rows[2]["modelled_comm_seconds"] == "0.0"
    assert rows[2]["network"] == "eth10"
    table = (tmp_path / "out" / "study.md").read_text()
    assert "3 runs: 3 finished." in table and table.count("\n| ") == 4  # header and three runs


def test_a_directory_of_runs_and_paths_relative_to_the_output(runs, tmp_path):
    shutil.copytree(runs["I2"], tmp_path / "study" / "a")
    shutil.copytree(runs["I4"], tmp_path / "study" / "b")
    (tmp_path / "study" / "not-a-run").mkdir()
    collect.collect([tmp_path / "study"], tmp_path / "study")
    rows = read_csv(tmp_path / "study" / "study.csv")
    assert [row["run"] for row in rows] == ["a", "b"]
    assert rows[0]["checkpoint"] == "a/checkpoints/step-000000008.h5"
    with pytest.raises(HpcoptError, match="is not a study, a run directory or a directory of runs"):
        collect.collect([tmp_path / "study" / "not-a-run"], tmp_path / "out")


def make_study(tmp_path: Path, runs: dict[str, Path], count: int, ranks: int = 1) -> Path:
    """A study directory of ``count`` tasks of ``ranks`` ranks (no run directories yet)."""
    study = tmp_path / "study"
    (study / layout.LOGS).mkdir(parents=True)
    lines = ["\t".join(layout.COLUMNS)]
    for i in range(count):
        lines.append(f"{i}\truns/t{i}\t{ranks}\t--dataset digits --hidden 16 --steps 8 --seed {i}")
    (study / layout.MANIFEST).write_text("\n".join(lines) + "\n")
    return study


def record(study: Path, index: int, code: int | None, locked: bool = True, log: str = "") -> layout.TaskRecord:
    entry = layout.read_manifest(study)[index]
    task = layout.TaskRecord(study, entry)
    task.start()
    layout.log_path(study, index).write_text(log)
    if code is not None:
        task.end(code)
    if not locked:  # a file system without locks
        path = layout.record_path(study, index)
        path.write_text(path.read_text().replace('"locked": true', '"locked": false'))
    return task


def test_states_from_the_task_records(runs, tmp_path):
    study = make_study(tmp_path, runs, 11)
    unfinished = tmp_path / "unfinished"  # a trace without its summary: the run did not end
    shutil.copytree(runs["I2"], unfinished)
    import h5py

    with h5py.File(unfinished / "trace.h5", "r+") as f:
        del f["summary"]
    for i in (0, 1, 2, 3, 4, 5, 6, 7, 9, 10):
        shutil.copytree(unfinished if i else runs["I2"], study / "runs" / f"t{i}")
    record(study, 0, None)  # the summary wins: finished, whatever its record says
    record(study, 1, 143)
    record(study, 2, 130)
    record(study, 3, 2, log="some output\nhpcopt: error: lr must be > 0\n\nmore output\n")
    held = record(study, 4, None)  # its process holds the lock: running
    record(study, 5, None, log="step 40/160\n").handle.close()  # the lock is gone, no exit recorded: killed
    record(study, 6, None, locked=False)
    record(study, 7, 0)
    (study / "runs" / "t7" / "trace.h5").unlink()
    record(study, 9, 0, log="^C[mpiexec@node] Sending Ctrl-C to processes as requested\n")  # Hydra's 0
    record(study, 10, 5)  # 5: the survivors of a lost rank finished, yet no end-of-run record
    rows = {row.found.entry.index: row for row in collect.gather([study])}
    states = {i: (rows[i].state, rows[i].note) for i in rows}
    assert states[0] == ("finished", "")
    assert states[1] == ("stopped", "exit 143 (SIGTERM)")
    assert states[2] == ("stopped", "exit 130 (SIGINT)")
    assert states[3] == ("failed", "exit 2: hpcopt: error: lr must be > 0")
    assert states[4][0] == "running" and states[4][1].startswith("on ")
    assert states[5] == ("interrupted", "its task ended without recording its exit (killed, or its node "
                         "died): step 40/160")
    assert states[6][0] == "incomplete" and "no locks" in states[6][1]
    # an exit code that says finished never counts without the trace's end-of-run record
    assert states[7] == ("failed", "exit 0, but no readable trace")
    assert states[8] == ("not started", "")
    assert states[9] == ("failed", "exit 0, but its trace has no end-of-run record: "
                         "^C[mpiexec@node] Sending Ctrl-C to processes as requested")
    assert states[10] == ("failed", "exit 5: finished on the survivors of a lost rank, but its trace has "
                          "no end-of-run record")
    assert rows[8].settings["seed"] == 8  # from the manifest, when there is no trace
    assert [rows[i].exit_code for i in range(11)] == [None, 143, 130, 2, None, None, None, 0, None, 0, 5]
    table = collect.columns(list(rows.values()), study)
    assert [values["exit_code"] for values in table] == [None, 143, 130, 2, None, None, None, 0, None, 0, 5]
    by_directory = collect.gather([study / "runs"])  # its run directories find their records too
    in_name_order = sorted((0, 1, 2, 3, 4, 5, 6, 7, 9, 10), key=lambda i: f"t{i}")
    assert [(row.state, row.note) for row in by_directory] == [states[i] for i in in_name_order]
    held.end(0)  # read again: its exit is recorded now (and its trace has no end-of-run record)
    assert collect.state(rows[4], collect.task_record(rows[4].found)) == (
        "failed", "exit 0, but its trace has no end-of-run record")


def test_damaged_traces_are_notes_and_the_others_are_read(runs, tmp_path):
    broken = truncated_trace(runs["I4"] / "trace.h5", tmp_path / "broken" / "trace.h5")
    reads = read_each([runs["I2"] / "trace.h5", broken, runs["I4"] / "trace.h5", broken])
    assert [type(r).__name__ for r in reads] == ["Trace", "HpcoptError", "Trace", "HpcoptError"]
    assert str(reads[1]).startswith(f"{broken} is a damaged")
    result = launch(["collect", str(runs["I2"]), str(broken.parent), "--out", str(tmp_path / "out")], ranks=1)
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    rows = read_csv(tmp_path / "out" / "study.csv")
    assert rows[1]["state"] == "incomplete" and f"trace not read: {broken} is a damaged" in rows[1]["note"]
    assert rows[1]["steps"] == "" and rows[0]["state"] == "finished"


def test_a_hundred_runs_are_collected_in_seconds(runs, tmp_path, capsys):
    for i in range(100):
        shutil.copytree(runs[("I2", "I4", "I4-eth")[i % 3]], tmp_path / "many" / f"r{i:03d}")
    start = time.perf_counter()
    collect.collect([tmp_path / "many"], tmp_path / "many")
    seconds = time.perf_counter() - start
    rows = read_csv(tmp_path / "many" / "study.csv")
    assert len(rows) == 100 and {row["state"] for row in rows} == {"finished"}
    assert [row["interval"] for row in rows[:3]] == ["2", "4", "4"]
    assert seconds < scaled(20), seconds
    with capsys.disabled():
        print(f"\ncollect of 100 runs: {seconds:.2f} s")


def test_collect_shows_progress_when_it_takes_a_while(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)  # as if it had taken a while
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.0)
    broken = truncated_trace(runs["I4"] / "trace.h5", tmp_path / "broken" / "trace.h5")
    collect.collect([runs["I2"], runs["I4"], broken.parent], tmp_path / "out")
    lines = [line.split(" (")[0] for line in capsys.readouterr().err.splitlines()]
    assert lines == ["collect: reading the traces of 3 of 3 runs",
                     "collect: read 2 of 3 traces; gathering 3 runs",
                     "collect: gathered 1 of 3 runs", "collect: gathered 2 of 3 runs",
                     "collect: gathered 3 of 3 runs",
                     "collect: gathered 3 runs, 2 of them with a readable trace"]


def test_the_last_progress_line_holds_the_final_counts(runs, tmp_path, monkeypatch, capsys):
    """Lines at most every few seconds: the last one shown is the end's, not one from the way
    (once "read 1 of 5 traces" stood last above a table of 5 rows)."""
    monkeypatch.setattr(progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(progress, "EVERY_SECONDS", 60.0)
    collect.collect([runs["I2"], runs["I4"]], tmp_path / "out")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("collect: reading the traces of 2 of 2 runs (")
    assert lines[1].startswith("collect: gathered 2 runs, 2 of them with a readable trace (")


def test_the_ticker_is_silent_at_first_then_at_most_every_few_seconds():
    now = [0.0]
    stream = io.StringIO()
    tick = progress.Ticker("collect", quiet=3.0, every=2.0, stream=stream, clock=lambda: now[0])
    for t in (0.5, 2.9, 3.0, 4.0, 5.0, 5.5, 7.1):
        now[0] = t
        tick(f"at {t}")
    assert stream.getvalue().splitlines() == ["collect: at 3.0 (3.0 s)", "collect: at 5.0 (5.0 s)",
                                              "collect: at 7.1 (7.1 s)"]


def test_collect_of_runs_without_out_prints_their_main_columns(runs, tmp_path, monkeypatch, capsys):
    """``collect RUN_DIR...`` (no study, no --out) prints the main columns of study.md's table,
    says how to get them all, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    dirs = [str(runs["I2"]), str(runs["I4"])]
    assert collect.run(argparse.Namespace(dirs=dirs, out=None)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not list(tmp_path.iterdir())
    assert lines[:3] == ["# hpcopt study", "", "2 runs: 2 finished."]
    assert lines[4] == "| run | state | interval | steps | train_loss | eval_loss | eval_accuracy | note |"
    assert [line.split(" | ")[2:4] for line in lines[6:8]] == [["2", "8"], ["4", "8"]]
    everything = read_csv(collect.collect(dirs, tmp_path / "out")[0])[0]
    assert len(everything) > 20  # the terminal shows 8 of them
    assert lines[8:] == ["", f"All {len(everything)} columns (bytes, seconds, exit codes, checkpoints) go to "
                         f"study.csv and study.md with: hpcopt collect {' '.join(dirs)} --out DIR"]


def test_collect_command_line_errors_are_one_line(runs, tmp_path):
    assert_one_line_error(launch(["collect", str(tmp_path), "--out", str(tmp_path / "o")], ranks=1),
                          "is not a study, a run directory or a directory of runs")


def test_report_of_a_study_takes_its_readable_runs_and_says_what_it_left_out(runs, tmp_path, capsys):
    from hpcopt.report import write_report

    study = make_study(tmp_path, runs, 4)
    shutil.copytree(runs["I2"], study / "runs" / "t0")
    shutil.copytree(runs["I4"], study / "runs" / "t1")
    truncated_trace(runs["I4"] / "trace.h5", study / "runs" / "t2" / "trace.h5")
    written = write_report([study], tmp_path / "report")
    assert sorted(p.name for p in written) == ["bytes.png", "interval.png", "report.md", "rounds.png",
                                               "steps.png", "wall.png"]
    assert (tmp_path / "report" / "report.md").read_text().count("| interval=") == 2
    assert f"report: 2 of the 4 runs of {study} have a readable trace" in capsys.readouterr().err


def test_the_peak_bytes_in_flight_of_a_streaming_run(runs, tmp_path):
    out = tmp_path / "streaming"
    fresh_train(build_config(None, {"dataset": "digits", "hidden": "16", "steps": "8", "progress": "false",
                                    "algorithm": "diloco", "interval": "4", "fragments": "2",
                                    "out": str(out)}))
    collect.collect([runs["I4"], out], tmp_path / "out")
    rows = read_csv(tmp_path / "out" / "study.csv")
    trace = read_each([out / "trace.h5"])[0]
    assert isinstance(trace, Trace)
    peak = trace.columns["peak_bytes_in_flight"]
    # the run's maximum; a run without fragments has no such column (blank)
    assert int(rows[1]["peak_bytes_in_flight"]) == peak.max() > 0
    assert rows[0]["peak_bytes_in_flight"] == ""
    assert "peak_bytes_in_flight" not in read_csv(collect.collect([runs["I4"]], tmp_path / "plain")[0])[0]


def trained_on(run: Path, to: Path, world_size: int, **attrs: str) -> None:
    """A copy of ``run`` whose trace says its first job trained on ``world_size`` ranks."""
    import h5py

    shutil.copytree(run, to)
    with h5py.File(to / "trace.h5", "a") as f:
        f.attrs.update({"world_size": world_size, **attrs})


def test_a_run_trained_on_another_number_of_ranks_than_its_task_asks_is_wrong(runs, tmp_path):
    """A 2-rank task's run trained by singletons (world size 1: srun without --mpi=pmi2 under
    a site's MpiDefault none) is wrong, finished or not; one resumed on another number with
    --ranks-changed (the trace keeps its first job's world size) or finished by the survivors of
    a lost rank is not."""
    study = make_study(tmp_path, runs, 5, ranks=2)
    trained_on(runs["I2"], study / "runs" / "t0", 1)  # a singleton's: world size 1
    trained_on(runs["I2"], study / "runs" / "t1", 2, resumed_at="[4]")  # then resumed on 1 rank
    trained_on(runs["I2"], study / "runs" / "t2", 4)
    shutil.copytree(runs["I2"], study / "runs" / "t3")  # a singleton still training
    import h5py

    with h5py.File(study / "runs" / "t3" / "trace.h5", "r+") as f:
        del f["summary"]
    record(study, 0, 0)
    record(study, 1, 0)
    record(study, 2, 0)
    running = record(study, 3, None)
    rows = collect.gather([study])
    singletons = ("trained on 1 rank(s), the task asks for 2: usually a launcher that started single-rank "
                  "copies, not one world (srun without --mpi=pmi2 or --mpi=pmix); move the run directory "
                  "away and run the task again")
    assert (rows[0].state, rows[0].note) == ("wrong", f"{singletons}; otherwise finished")
    assert (rows[1].state, rows[1].note) == ("finished", "")
    assert rows[2].state == "wrong" and rows[2].note.startswith(
        "trained on 4 rank(s), the task asks for 2: its launcher started another number of ranks;")
    assert rows[3].state == "wrong" and rows[3].note.startswith(f"{singletons}; otherwise running (on ")
    assert (rows[4].state, rows[4].note) == ("not started", "")
    table = collect.columns(rows, study)
    assert [values["ranks"] for values in table] == [1, 2, 4, 1, 2]  # what each trained on
    assert "5 runs: 3 wrong, 1 finished, 1 not started." in collect.markdown(table)
    running.end(143)
    assert collect.state(rows[3], collect.task_record(rows[3].found)) == (
        "wrong", f"{singletons}; otherwise stopped (exit 143 (SIGTERM))")
