"""Imported first by the local launcher's forkserver (`launcher.FORKSERVER_PRELOAD`): from here
on the forkserver ignores SIGINT, which multiprocessing makes it do only after its preload. A
Ctrl-C reaching the process group while the forkserver imported torch (its first two seconds)
printed the forkserver's traceback under the run's one `error: interrupted` line. The launcher
ends the forkserver as it exits; the ranks get Python's SIGINT handler back (`_rank_entry`)."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
