"""Progress reporting: a redrawn bar on a terminal, plain periodic lines in a log file."""

import io

from kjax.progress import LineProgress, progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_log_file_gets_one_line_per_twentieth_and_the_last_step():
    out = io.StringIO()
    bar = progress(100, 0, "run", file=out)
    assert isinstance(bar, LineProgress)
    for step in range(100):  # as the loops do: update, then that step's metrics
        bar.update(1)
        bar.set_postfix(reward=f"{step / 100:.2f}")
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 20 and "\r" not in out.getvalue()
    assert lines[0].startswith("run: step 5/100 (") and lines[0].endswith("reward=0.04")
    assert lines[-1].startswith("run: step 100/100 (")


def test_a_resumed_run_counts_from_where_it_stopped_and_short_runs_print_every_step():
    out = io.StringIO()
    with progress(7, 4, "resumed", file=out) as bar:
        for _ in range(3):
            bar.update(1)
    assert [line.split(" (")[0] for line in out.getvalue().splitlines()] == [
        "resumed: step 5/7",
        "resumed: step 6/7",
        "resumed: step 7/7",
    ]


def test_a_terminal_gets_a_bar_and_disabled_prints_nothing():
    tty = _Tty()
    bar = progress(10, 0, "bar", file=tty)
    assert not isinstance(bar, LineProgress)  # tqdm's
    bar.close()
    out = io.StringIO()
    off = progress(10, 0, "off", enabled=False, file=out)
    off.update(10)
    off.close()
    assert out.getvalue() == ""
