"""The benchmark cases, one module each: its variants (the labels the
report and the chart read) and run(conns, srv), which measures and adds the
figures to measure.R. conns: {"main": connection to the classic server,
"js53": to the js53 server (case 1 only)}; srv: the classic server.

They run in the order of ORDER: case 3 (pgbench, most load) and case 6
(pgbench, then loads that write several GB of WAL and data) last, and
case 7 (backfill, on a server of its own) after them."""

from cases import case1, case2, case3, case4, case5, case6, case7

CASES = {"1": case1, "2": case2, "3": case3, "4": case4, "5": case5, "6": case6,
         "7": case7}
ORDER = ["1", "2", "4", "5", "3", "6", "7"]
