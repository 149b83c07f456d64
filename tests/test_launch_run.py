"""sparktf.run on the shared local[2] session with small programs that do not import TensorFlow."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sparktf
from sparktf.errors import SparkTFError

POLL_S = 60.0


def _wait_for(condition, timeout=POLL_S, interval=0.1):
    """Poll ``condition`` until it is true or ``timeout`` seconds passed; return its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(interval)
    return condition()


def _ended(pid: int) -> bool:
    """The process is gone or a zombie (it ran nothing any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def _describe_and_greet(args, ctx):
    print(f"hello from {ctx.job_name} {ctx.task_index}")
    print(f"warning from {ctx.job_name} {ctx.task_index}", file=sys.stderr)
    return {
        "pid": os.getpid(),
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "worker_num": ctx.worker_num,
        "num_workers": ctx.num_workers,
        "cluster_spec": ctx.cluster_spec,
        "tf_config_env": os.environ["TF_CONFIG"],
        "tf_config": ctx.tf_config,
        "default_fs": ctx.default_fs,
        "data_path": ctx.absolute_path("data"),
        "log_dir": ctx.log_dir,
        "args": args,
        "extra_env": os.environ.get("SPARKTF_TEST_VAR"),
    }


def test_chief_result_ctx_and_both_roles_logs_reach_the_driver(sc, capsys, tmp_path):
    result = sparktf.run(
        _describe_and_greet, args={"lr": 0.1}, num_workers=2, master_node="chief",
        log_dir=str(tmp_path / "tb"), env={"SPARKTF_TEST_VAR": "yes"}, timeout=120,
    )
    out = capsys.readouterr().out
    assert "[chief 0] hello from chief 0" in out and "[worker 0] hello from worker 0" in out
    assert "[chief 0] warning from chief 0" in out and "[worker 0] warning from worker 0" in out
    assert (result["job_name"], result["task_index"], result["worker_num"], result["num_workers"]) == ("chief", 0, 0, 2)
    chief, worker = result["cluster_spec"]["chief"], result["cluster_spec"]["worker"]
    assert len(chief) == len(worker) == 1 and chief != worker and chief[0].startswith("127.0.0.1:")
    assert result["tf_config"] == {"cluster": {"chief": chief, "worker": worker}, "task": {"type": "chief", "index": 0}}
    assert result["tf_config_env"] and result["tf_config"] == __import__("json").loads(result["tf_config_env"])
    assert result["default_fs"].startswith("file:")
    assert result["data_path"] == os.path.join(os.getcwd(), "data")
    assert result["log_dir"] == str(tmp_path / "tb")
    assert result["args"] == {"lr": 0.1} and result["extra_env"] == "yes"
    assert result["pid"] != os.getpid()


def _count_to(args, ctx):
    return {"pid": os.getpid(), "sum": sum(range(args)), "role": ctx.job_name}


def test_run_twice_in_one_session_uses_fresh_processes(sc):
    first = sparktf.run(_count_to, args=10, num_workers=2, timeout=120)
    second = sparktf.run(_count_to, args=100, num_workers=2, timeout=120)
    assert (first["sum"], second["sum"]) == (45, 4950)
    assert first["role"] == second["role"] == "worker"
    assert first["pid"] != second["pid"] and _ended(first["pid"])


def _meet(markers, ctx):
    """Leave this run's marker, then wait (bounded) for the other run's: True only if both ran at once."""
    mine, partner = markers
    Path(mine).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(partner) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"met": os.path.exists(partner), "pid": os.getpid(), "cluster": ctx.cluster_spec["worker"]}


def test_two_concurrent_runs_each_get_a_slot_and_a_cluster_of_their_own(sc, tmp_path):
    from concurrent_calls import in_threads

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    threads, outcomes = in_threads({"a": lambda: sparktf.run(_meet, args=(a, b), num_workers=1, timeout=120),
                                    "b": lambda: sparktf.run(_meet, args=(b, a), num_workers=1, timeout=120)})
    for thread in threads:
        thread.join(180)
    assert all(isinstance(outcomes.get(name), dict) and outcomes[name]["met"] for name in "ab"), outcomes
    assert outcomes["a"]["pid"] != outcomes["b"]["pid"] and outcomes["a"]["cluster"] != outcomes["b"]["cluster"]


def _await_driver_then_report(go_file, ctx):
    if ctx.worker_num == 0:
        print("waiting for the driver to see this line", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(go_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.path.exists(go_file)
    return None


def test_lines_reach_the_driver_while_the_child_still_runs(sc, tmp_path):
    go_file = tmp_path / "go"

    class Release(logging.Handler):
        def emit(self, record):
            if "[worker 0] waiting for the driver" in record.getMessage():
                go_file.touch()

    logger = logging.getLogger("sparktf.run")
    handler, level = Release(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        assert sparktf.run(_await_driver_then_report, args=str(go_file), num_workers=2, timeout=120) is True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _raise_on_worker_1_after_worker_0_started(pid_dir, ctx):
    pid_dir = Path(pid_dir)
    if ctx.worker_num == 1:
        deadline = time.monotonic() + 60
        while not (pid_dir / "grandchild.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ValueError("worker 1 cannot read its shard on purpose")
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (pid_dir / "child.pid").write_text(str(os.getpid()))
    (pid_dir / "grandchild.pid.tmp").write_text(str(grandchild.pid))
    os.replace(pid_dir / "grandchild.pid.tmp", pid_dir / "grandchild.pid")
    time.sleep(300)


def test_a_failing_worker_fails_the_job_with_its_traceback_and_leaves_no_process(sc, tmp_path):
    started = time.monotonic()
    with pytest.raises(SparkTFError) as raised:
        sparktf.run(_raise_on_worker_1_after_worker_0_started, args=str(tmp_path), num_workers=2, timeout=200)
    message = str(raised.value)
    assert message.splitlines()[0] == (
        "sparktf.run: worker 1 failed (exit code 1): ValueError: worker 1 cannot read its shard on purpose"
    )
    assert "Traceback (most recent call last):" in message and "_raise_on_worker_1_after_worker_0_started" in message
    assert len(message.splitlines()) <= 102
    assert time.monotonic() - started < 100  # not the 300 s of worker 0's sleep
    pids = [int((tmp_path / name).read_text()) for name in ("child.pid", "grandchild.pid")]
    assert _wait_for(lambda: all(_ended(pid) for pid in pids)), f"left running: {pids}"


def _watch_the_rank_that_returned(folder, ctx):
    """Rank 1 returns at once; rank 0 then watches rank 1's process for 1 s: True if it stayed up."""
    mine = Path(folder, f"rank{ctx.worker_num}")
    Path(f"{mine}.tmp").write_text(str(os.getpid()))
    os.rename(f"{mine}.tmp", mine)
    if ctx.worker_num == 1:
        return None
    other = Path(folder, "rank1")
    deadline = time.monotonic() + 60
    while not other.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(other.read_text())
    watched_until = time.monotonic() + 1  # rank 1 returns right after its file: gone in milliseconds if not held
    while time.monotonic() < watched_until:
        if _ended(pid):
            return False
        time.sleep(0.05)
    return True


def test_a_rank_whose_program_returned_stays_up_until_every_rank_has_and_then_ends(sc, tmp_path):
    # a peer may still pull the last collective's buffers from its TensorFlow server (MultiWorkerMirroredStrategy)
    assert sparktf.run(_watch_the_rank_that_returned, args=str(tmp_path), num_workers=2, timeout=120) is True
    pids = [int((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)]
    assert _wait_for(lambda: all(_ended(pid) for pid in pids)), f"left running: {pids}"


def _hang(pid_file, ctx):
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(300)


def test_a_hung_child_is_killed_at_the_timeout(sc, tmp_path):
    pid_file = tmp_path / "hung.pid"
    started = time.monotonic()
    with pytest.raises(SparkTFError, match=r"worker \d failed \(timeout: still running after 6 s; killed\)"):
        sparktf.run(_hang, args=str(pid_file), num_workers=2, timeout=6)
    assert time.monotonic() - started < 60
    assert _wait_for(lambda: _ended(int(pid_file.read_text())))


def test_more_workers_than_task_slots_fail_at_once(sc):
    started = time.monotonic()
    with pytest.raises(SparkTFError, match="needs 3 tasks running at once.*at most 2"):
        sparktf.run(_count_to, args=1, num_workers=3)
    assert time.monotonic() - started < 10
