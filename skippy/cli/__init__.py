"""The command line: the command table and its options, the invoke tasks and nox sessions made from
it, each command's thin entry point (parse, call one flow or library function, report), the exit
codes, and the ``--json`` reports.

The top layer: it imports every layer below and nothing imports it.
"""
