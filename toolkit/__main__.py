import signal
import sys

from toolkit.liveness import STOP_SIGNALS

# Held (pending, not lost) while the command line is imported and parsed: ``run`` lets them
# in once its handlers are set, any other command at once (cli/signals.py).
signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

from toolkit.cli import main  # noqa: E402

sys.exit(main())
