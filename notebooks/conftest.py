"""nbval settings for the notebooks: compare text, not logs or pictures; kernels over IPC.

stderr carries progress bars and library logs; images and HTML renderings are checked through
their text twins (each notebook prints one small results table to stdout). The hidden copy
`python -m analysis report` writes beside a notebook while it runs is not one of them.

nbval starts each notebook's kernel with jupyter_client's `KernelManager` itself and has no
option for the transport: the class it looks up is replaced here with one that starts kernels
over IPC (`analysis.report.kernels`), as `make report` does: no "Kernel is running over TCP
without encryption" warning, no localhost ports.
"""

import nbval.kernel

from analysis.report.kernels import over_ipc

nbval.kernel.KernelManager = over_ipc(nbval.kernel.KernelManager)

collect_ignore_glob = [".*.ipynb"]


def pytest_collectstart(collector):
    if getattr(collector, "fspath", None) and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr", "text/html", "image/svg+xml", "application/javascript")
