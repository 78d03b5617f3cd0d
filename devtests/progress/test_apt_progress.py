"""The progress of an apt install in flight (role glm5's tasks/apt.yml follows its job with
module glm5_job_progress, apt: true): module_utils/glm5_apt_progress.py reads apt's and
dpkg's own records, module_utils/glm5_progress.py's describe puts them in words.

apt/term.log and apt/history.log are apt's logs of two real installs in the test image
(Debian 13, apt 3.0): `apt-get install build-essential` (62 packages), then `apt-get
install nginx python3-cryptography` (5 packages) fetched at 400 kB/s (apt's
Acquire::http::Dl-Limit), both with the apt module's options. The logs are only ever
appended to (snapshots taken every 0.5 s during those installs were prefixes of the final
files), so a prefix of them is what a round read at that moment."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from adhoc import call_module
from load_file import load_file, load_role_module

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
job_progress = load_role_module("roles/glm5/library/glm5_job_progress.py")
apt = load_file(ROOT / "roles" / "glm5" / "module_utils" / "glm5_apt_progress.py", "glm5_apt_progress_reader")
words = load_file(ROOT / "roles" / "glm5" / "module_utils" / "glm5_progress.py", "glm5_apt_progress_words")
TERM = (HERE / "apt" / "term.log").read_bytes().decode()  # its \r\n line ends kept
HISTORY = (HERE / "apt" / "history.log").read_bytes().decode()
FIRST, SECOND = "2026-12-07  16:30:06", "2026-12-07  16:30:31"  # the two runs' dpkg starts
FIRST_END, SECOND_END = "2026-12-07  16:30:11", "2026-12-07  16:30:33"
# The second run's job began two seconds before its dpkg (lists read, archives fetched).
SINCE = apt.stamp_epoch(SECOND) - 2
# apt-get's output of the second run, as the apt module returns it (stdout), in part.
STDOUT = """Reading package lists...
The following NEW packages will be installed:
  nginx nginx-common python3-bcrypt python3-cffi-backend python3-cryptography
0 upgraded, 5 newly installed, 0 to remove and 0 not upgraded.
Need to get 1972 kB of archives.
Get:5 http://deb.debian.org/debian trixie/main amd64 python3-cryptography amd64 43.0.0-3+deb13u1 [942 kB]
Fetched 1972 kB in 3s (652 kB/s)
Setting up python3-cryptography (43.0.0-3+deb13u1) ...
"""


def _upto(text: str, marker: str) -> str:
    """The log as it was once ``marker`` (the end of a line) had been written."""
    return text[:text.index(marker) + len(marker)]


def _at(text: str, epoch: float, old: str = SECOND) -> str:
    """The log with the stamp ``old`` moved to ``epoch`` (local time, as apt writes it)."""
    return text.replace(old, time.strftime("%Y-%m-%d  %H:%M:%S", time.localtime(epoch)))


def _logs(folder: Path, term: str, history: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "term.log").write_bytes(term.encode())
    (folder / "history.log").write_bytes(history.encode())
    return folder


def test_only_the_jobs_own_block_counts() -> None:
    assert apt.last_block(TERM, apt.TERM_START, SINCE).startswith(f"Log started: {SECOND}")
    first = apt.last_block(TERM, apt.TERM_START, apt.stamp_epoch(FIRST))
    assert first is not None and first.startswith(f"Log started: {SECOND}"), "the last block since then"
    assert apt.last_block(TERM, apt.TERM_START, apt.stamp_epoch(SECOND) + 5) is None
    # the first run's block alone, as it was while the first job ran
    block = apt.last_block(_upto(TERM, f"Log ended: {FIRST_END}"), apt.TERM_START,
                           apt.stamp_epoch(FIRST) - 3)
    assert block is not None and block.startswith(f"Log started: {FIRST}") and "nginx" not in block


def test_history_gives_the_total_before_dpkg_unpacks_anything() -> None:
    # history.log as it was while the first run's dpkg ran: its list, no End-Date yet
    running = apt.last_block(_upto(HISTORY, "linux-libc-dev:amd64 (6.12.117-1, automatic)\n"), apt.HISTORY_START,
                             apt.stamp_epoch(FIRST) - 1)
    assert running is not None and "End-Date" not in running
    assert apt.history_plan(running) == {"packages": 62, "removals": 0, "ended": False}
    assert apt.history_plan(apt.last_block(HISTORY, apt.HISTORY_START, SINCE)) == {
        "packages": 5, "removals": 0, "ended": True}
    # Upgrades name two versions, removals count apart (apt's format).
    block = ("Start-Date: 2026-12-07  17:00:00\nCommandline: apt-get install cuda-toolkit-12-9\n"
             "Upgrade: libc6:amd64 (2.41-12, 2.41-12+deb13u5), libc-bin:amd64 (2.41-12, 2.41-12+deb13u5)\n"
             "Install: cuda-toolkit-12-9:amd64 (12.9.1-1)\nRemove: nvidia-open-575:amd64 (575.57.08-1)\n")
    assert apt.history_plan(block) == {"packages": 3, "removals": 1, "ended": False}


def test_dpkg_in_flight_counts_unpacked_and_set_up_with_its_last_line() -> None:
    term = _upto(TERM, "Setting up libctf-nobfd0:amd64 (2.44-3) ...\r\n")
    done = apt.dpkg_done(apt.last_block(term, apt.TERM_START, apt.stamp_epoch(FIRST) - 1))
    assert done == {"unpacked": 62, "set_up": done["set_up"], "removed": 0,
                    "last": "Setting up libctf-nobfd0:amd64 (2.44-3) ...", "ended": False}
    assert 0 < done["set_up"] < 62
    # The database reading line (one line of \r-separated percentages) is never the last word.
    early = _upto(TERM, "(Reading database ... 8642 files and directories currently installed.)\r\n")
    assert apt.dpkg_done(apt.last_block(early, apt.TERM_START, apt.stamp_epoch(FIRST) - 1))["last"] == \
        "Selecting previously unselected package liblocale-gettext-perl."
    long_line = "Building initial module nvidia/580.95.05 for 6.8.0-45-generic " + "x" * 300
    assert len(apt.dpkg_done(f"Log started: {FIRST}\n{long_line}\r\n")["last"]) == apt.LAST_CHARS


def test_a_round_in_each_phase(tmp_path: Path) -> None:
    archives, lists = tmp_path / "archives", tmp_path / "lists"
    (archives / "partial").mkdir(parents=True)
    (lists / "partial").mkdir(parents=True)
    old = archives / "gcc-14_14.2.0-19_amd64.deb"  # a previous run's download
    old.write_bytes(b"x" * 10)
    time.sleep(1.2)
    since = time.time() - 0.2
    # apt's logs hold the previous run only (its stamps ten minutes before this job's start)
    logs = _logs(tmp_path / "log", _at(_upto(TERM, f"Log ended: {FIRST_END}\n"), since - 600, FIRST),
                 _at(_upto(HISTORY, f"End-Date: {FIRST_END}\n"), since - 600, FIRST))

    def line() -> str:
        return str(words.describe(apt.apt_progress(str(logs), str(archives), str(lists), since, now=since + 130)))

    assert line() == "resolving the packages: nothing fetched or unpacked yet after 2 min 10 s"
    (lists / "partial" / "deb.debian.org_debian_dists_trixie_main_binary-amd64_Packages.xz").write_bytes(b"x" * 2500)
    assert line() == ("updating the package lists: 2.5 kB so far; now"
                      " deb.debian.org_debian_dists_trixie_main_binary-amd64_Packages.xz (2.5 kB so far)")
    # What the second run's fetch left at 400 kB/s: two archives in place, one in flight.
    (archives / "nginx-common_1.26.3-3+deb13u10_all.deb").write_bytes(b"x" * 111828)
    (archives / "nginx_1.26.3-3+deb13u10_amd64.deb").write_bytes(b"x" * 613548)
    (archives / "partial" / "python3-bcrypt_4.2.0-2.1+b1_amd64.deb").write_bytes(b"x" * 101617)
    assert line() == ("fetching the packages: 827.0 kB so far in 2 min 10 s, 2 files complete;"
                      " now python3-bcrypt_4.2.0-2.1+b1_amd64.deb (101.6 kB so far)")
    # Its dpkg, with history.log's list: stamps of this job (the fixture's, moved to now).
    (archives / "partial" / "python3-bcrypt_4.2.0-2.1+b1_amd64.deb").unlink()
    (archives / "python3-bcrypt_4.2.0-2.1+b1_amd64.deb").write_bytes(b"x" * 210892)
    term = _at(_at(_upto(TERM, "Setting up nginx-common (1.26.3-3+deb13u10) ...\r\n"), since + 1), since - 600, FIRST)
    history = _at(_at(HISTORY[:HISTORY.index(f"End-Date: {SECOND_END}")], since + 1), since - 600, FIRST)
    _logs(logs, term, history)
    assert line() == ("dpkg has unpacked 5 of 5 packages and set up 2 of 5 (936.3 kB fetched);"
                      " last: Setting up nginx-common (1.26.3-3+deb13u10) ...")
    _logs(logs, _at(_at(TERM, since + 1), since - 600, FIRST), _at(_at(HISTORY, since + 1), since - 600, FIRST))
    assert line() == ("dpkg has unpacked 5 of 5 packages and set up 5 of 5 (936.3 kB fetched);"
                      " dpkg has finished, apt is ending")


def test_the_end_in_apts_own_words() -> None:
    assert apt.apt_summary({"changed": True, "stdout": STDOUT}) == (
        "done: 0 upgraded, 5 newly installed, 0 to remove and 0 not upgraded; Fetched 1972 kB in 3s (652 kB/s)")
    assert apt.apt_summary({"changed": False, "stdout": ""}) == "done: nothing to change"
    assert apt.apt_summary({"failed": True, "rc": 100, "msg": "E: Unable to locate package nosuch"}) == \
        "apt failed (rc 100): its message follows"


def _results_file(tmp_path: Path) -> Path:
    path = tmp_path / "j42.7"
    path.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j42.7"}))
    return path


@pytest.mark.parametrize("finished", [False, True])
def test_job_progress_follows_an_apt_job(tmp_path: Path, finished: bool) -> None:
    """A round of module glm5_job_progress with apt: true: in flight, the line from the logs
    of this job (since its results file's start record); at the end, apt's summary and the
    kept keys of the apt module's result."""
    results = _results_file(tmp_path)
    start = results.stat().st_mtime
    logs = _logs(tmp_path / "log", _at(_upto(TERM, "Unpacking nginx (1.26.3-3+deb13u10) ...\r\n"), start + 1),
                 _at(HISTORY[:HISTORY.index(f"End-Date: {SECOND_END}")], start + 1))
    os.utime(results, (start - 5, start - 5))  # the job began 5 s ago
    if finished:
        results.write_text(json.dumps({"changed": True, "stdout": STDOUT, "stderr": "", "diff": {},
                                       "invocation": {"module_args": {"name": ["nginx"]}}}))
    args = {"results_file": str(results), "wait": 0.0, "apt": True, "apt_log_dir": str(logs),
            "apt_archives": str(tmp_path / "none"), "apt_lists": str(tmp_path / "none"),
            "keep": ["changed", "failed", "msg", "rc", "stdout", "diff"]}
    got = call_module(job_progress, args)
    assert got["finished"] is finished and not got.get("failed"), got
    if finished:
        assert got["line"].startswith("done: 0 upgraded, 5 newly installed,")
        assert got["result"] == {"changed": True, "stdout": STDOUT, "diff": {}}
    else:
        assert got["line"] == ("dpkg has unpacked 2 of 5 packages and set up 0 of 5;"
                               " last: Unpacking nginx (1.26.3-3+deb13u10) ...")
        assert got["result"] == {}
