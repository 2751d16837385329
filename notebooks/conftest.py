"""nbval settings for the notebooks: compare text, not logs or pictures; kernels over IPC.

stderr carries progress bars and library logs; images and HTML renderings are checked through
their text twins (each notebook prints one small results table to stdout). The hidden copy
`python -m analysis report` writes beside a notebook while it runs is not one of them.

nbval starts each notebook's kernel with jupyter_client's `KernelManager` itself and has no
option for the transport: the class it looks up is replaced here with one that starts kernels
over IPC (`analysis.report.kernels`), as `make report` does: no "Kernel is running over TCP
without encryption" warning, no localhost ports.

`make test` runs nbval beside pytest, as a background job, which the shell starts with Ctrl-C
ignored; on Ctrl-C the Makefile sends it SIGTERM instead, which stops it as Ctrl-C would, so that
nbval shuts its kernels down (and their servers with them).
"""

import signal

import nbval.kernel

from analysis.report.kernels import over_ipc

nbval.kernel.KernelManager = over_ipc(nbval.kernel.KernelManager)

collect_ignore_glob = [".*.ipynb"]


def pytest_collectstart(collector):
    if getattr(collector, "fspath", None) and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr", "text/html", "image/svg+xml", "application/javascript")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupt)
