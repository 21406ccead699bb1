"""`reame bench`: Reame's features measured on this host, each against its own baseline.

Every workload runs a feature (A) and its baseline (B) in fresh processes, alternating,
several repetitions; a row gives the median ratio, the baseline's absolute figure, and the
host, model and version it was measured on. The research scripts in the repository's
`benchmarks/` go deeper into each feature; this package is what an installed Reame runs.

    workloads.py  what each workload compares, its sizes and what it needs
    texts.py      the prompts the workloads send
    trial.py      one measurement's description and result, as they cross processes
    arms.py       the measured code of each workload, run inside a trial's process
    trace.py      the realistic workload: the shipped trace (data/), its slices, its figures
    replay.py     the trace sent to a server on its own clock
    schema_check.py  whether a structured answer follows its JSON schema
    pairs.py      the draft model a benchmarked model pairs with, or why it has none
    child.py      the process a trial runs in, and the parent's side of it
    runner.py     the alternation of A and B, and the rows made of their samples
    stats.py      medians and ratios
    host.py       the facts every report names: CPU, cores, RAM, model file, version, date
    against.py    the HTTP workloads, driven against any OpenAI-compatible server
    report.py     the report's rows and provenance, as JSON
    markdown.py   the report as a markdown table
    plot.py       an SVG of the ratios
"""
