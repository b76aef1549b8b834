"""Reports as a library: everything a sweep or a zoo report shows, rebuilt at any time from the files the runs wrote.

    loading       the folder's score rows and checkpoints, joined into the frames the tables use
    tables        the report's tables (per checkpoint, per size, plateau, last vs best layer, geometry, sample efficiency)
    noise         error bars over seeds and the tests of the report's comparisons, with their sentences
    plots         the figures; colours are passed in, each figure comes back with its caption (Plot)
    vocabulary    the human name of every column, probe and axis: one home for plot labels, panel titles and table headers
    markdown      Markdown tables and sections, the HTML page (markdown-it-py; tables scroll in their own box)
    text_tables   the plain-text tables the probe, geometry and mteb commands print
    sweep_report  a sweep folder's report (`crossbert report SWEEP_DIR`)
    zoo_report    a zoo folder's report: the same pieces, parameterised by model instead of checkpoint
    staging       where a report is written: a staging folder whose files replace the previous report's once all are whole
    store_report  any results store's report (each model's layer curves with intervals), and build_report, which picks
                  the report a folder gets (`crossbert report PATH`)

No module keeps state between builds: a report is a function of its folder.
"""
