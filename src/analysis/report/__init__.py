"""Report: the notebooks re-executed (`notebooks`: papermill, HTML export, notebook 03 once per
sweep point), the wall time of each stage of `make report` (`timings`), and the numbers of each
notebook's prose checked against what its run printed (`prose`).
"""
