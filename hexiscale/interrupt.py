"""What a Ctrl-C prints, wherever it lands: one line and exit 130. Imported by the command's
entry point before anything heavy (`hexiscale.__main__`) and by the commands' error handling
(`hexiscale.cli.app.friendly_errors`), so a Ctrl-C during the imports and one during the work
read alike; typer's own handling ended the work with 130 and nothing on the terminal."""

import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


def interrupted() -> None:
    """One line and exit 130; a second Ctrl-C while it is written cannot cut it into a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    sys.exit(EXIT_INTERRUPTED)
