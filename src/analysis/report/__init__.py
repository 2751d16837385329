"""Report: the notebooks re-executed (`notebooks`: papermill, HTML export, notebook 03 once per
sweep point) and the wall time of each stage of `make report` (`timings`).
"""
