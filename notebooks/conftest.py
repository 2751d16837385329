"""nbval settings for the notebooks: compare text, not logs or pictures; kernels over IPC; the
serving study's servers started once for the notebooks that measure on them.

stderr carries progress bars and library logs; images and HTML renderings are checked through
their text twins (each notebook prints one small results table to stdout). The hidden copy
`python -m analysis report` writes beside a notebook while it runs is not one of them.

nbval starts each notebook's kernel with jupyter_client's `KernelManager` itself and has no
option for the transport: the class it looks up is replaced here with one that starts kernels
over IPC (`analysis.report.kernels`), as `make report` does: no "Kernel is running over TCP
without encryption" warning, no localhost ports.

As in `make report`, notebooks 08 and 10 share one pair of servers (`ServerKeeper`), started
before the first one's kernel (so that the kernel inherits where to find them) and stopped
after the last.
"""

from pathlib import Path

import nbval.kernel
import pytest

from analysis.report.kernels import over_ipc
from analysis.report.server_keeper import ServerKeeper

nbval.kernel.KernelManager = over_ipc(nbval.kernel.KernelManager)

collect_ignore_glob = [".*.ipynb"]

_run: dict = {"keeper": ServerKeeper([]), "notebook": None}


def pytest_collectstart(collector):
    if getattr(collector, "fspath", None) and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr", "text/html", "image/svg+xml", "application/javascript")


def pytest_collection_modifyitems(items):
    _run["keeper"] = ServerKeeper(list(dict.fromkeys(Path(str(i.fspath)) for i in items)))


@pytest.hookimpl(tryfirst=True)  # before nbval's setup starts the notebook's kernel
def pytest_runtest_setup(item):
    notebook = Path(str(item.fspath))
    if notebook != _run["notebook"]:
        if _run["notebook"] is not None:
            _run["keeper"].after(_run["notebook"])
        _run["keeper"].before(notebook)
        _run["notebook"] = notebook


def pytest_sessionfinish():
    _run["keeper"].close()
