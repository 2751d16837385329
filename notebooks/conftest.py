"""nbval settings for the notebooks: compare text, not logs or pictures.

stderr carries progress bars and library logs; images and HTML renderings are checked through
their text twins (each notebook prints one small results table to stdout). The hidden copy
`python -m analysis report` writes beside a notebook while it runs is not one of them.
"""

collect_ignore_glob = [".*.ipynb"]


def pytest_collectstart(collector):
    if getattr(collector, "fspath", None) and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr", "text/html", "image/svg+xml", "application/javascript")
