"""What a rank says of the others when it stops (mxnet_pfc.runtime.stops), on simulated peers in one process."""
import os
import subprocess

import pytest

from mxnet_pfc.runtime import comm, failure_records, stops
from mxnet_pfc.runtime.run_folder import RunFolder


@pytest.fixture
def two_ranks_here(tmp_path, monkeypatch):
    """This process as rank 0 of 2; rank 1 a process of this host that has ended. Returns the logs folder."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    monkeypatch.setattr(comm, "size", lambda: 2)
    monkeypatch.setattr(comm, "rank", lambda: 0)
    monkeypatch.setitem(stops._state, "run", RunFolder(str(tmp_path)))
    monkeypatch.setitem(stops._state, "peers", [(0, 7, os.getpid()), (1, 7, ended.pid)])
    os.makedirs(tmp_path / "logs")
    return tmp_path / "logs", ended.pid


def test_a_local_rank_gone_without_a_word_is_named(two_ranks_here):
    _, pid = two_ranks_here
    assert stops.other_rank_cause() == (f"rank 1 (pid {pid}, this host) ended without a message: killed (SIGKILL, "
                                        f"the out-of-memory killer) or crashed; the launcher's output gives its "
                                        f"exit status")


def test_a_rank_that_lost_contact_too_is_not_called_killed(two_ranks_here, monkeypatch):
    """A cut link ends every rank within the Gloo timeout. The rank that stops on a lost peer leaves a
    record, so a rank that looks later does not take its exit for a silent death, and the elastic
    supervisor (first_failure) does not take it for an error of the run's own."""
    logs, _ = two_ranks_here
    monkeypatch.setattr(stops, "abort", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    monkeypatch.setattr(comm, "rank", lambda: 1)          # rank 1 stops first, on a lost peer
    with pytest.raises(SystemExit):
        stops.stop_on_error(comm.LostRankError("step 19: lost contact with the other ranks"))
    record = open(logs / "failed-rank1.txt").read()
    assert record.startswith(failure_records.LOST_CONTACT), record
    monkeypatch.setattr(comm, "rank", lambda: 0)          # then rank 0, whose peer has exited
    assert stops.other_rank_cause() is None
    assert failure_records.first_failure(failure_records.read(RunFolder(str(logs.parent)), range(2))) is None
    # a failure of its own still counts
    (logs / "failed-rank1.txt").write_text("DataError: record 7 is damaged\n")
    assert stops.other_rank_cause() == "rank 1 failed: DataError: record 7 is damaged"


def test_the_first_crash_is_named_when_a_peer_crashed_after_it(tmp_path, monkeypatch):
    """Three ranks: rank 2 crashed, then rank 0 crashed inside MXNet as it stopped. Rank 1 names rank 2."""
    monkeypatch.setattr(comm, "size", lambda: 3)
    monkeypatch.setattr(comm, "rank", lambda: 1)
    monkeypatch.setitem(stops._state, "run", RunFolder(str(tmp_path)))
    monkeypatch.setitem(stops._state, "peers", [])
    os.makedirs(tmp_path / "logs")
    for rank, when in ((2, 1_000_000_000), (0, 2_000_000_000)):
        path = tmp_path / "logs" / f"crash-rank{rank}.txt"
        path.write_text(f"Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
                        f'  File "x.py", line {rank} in f\n')
        os.utime(path, ns=(when, when))
    assert stops.other_rank_cause().startswith('rank 2 crashed: Segmentation fault in File "x.py", line 2 in f')


def test_a_rank_ended_by_the_launcher_after_a_lost_contact_says_so(two_ranks_here, monkeypatch):
    """Rank 1 stopped on a lost peer; the launcher then ends rank 0 with SIGTERM: not 'interrupted'."""
    logs, _ = two_ranks_here
    (logs / "failed-rank1.txt").write_text(failure_records.LOST_CONTACT + "step 5: lost contact with the other ranks\n")
    message = stops.explain_signal(15)
    assert message.startswith("stopping: rank 1 lost contact with the other ranks") and "interrupted" not in message


def test_an_own_failure_record_is_not_replaced_by_the_signal_that_follows(two_ranks_here):
    logs, _ = two_ranks_here
    stops.record_failure("DataError: record 7 is damaged")
    stops.record_failure(failure_records.SIGNALLED + "SIGTERM")
    stops.record_failure(failure_records.LOST_CONTACT + "step 5: lost contact")
    assert open(logs / "failed-rank0.txt").read() == "DataError: record 7 is damaged\n"
