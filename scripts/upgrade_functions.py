#!/usr/bin/env python3
"""Prints the CREATE FUNCTION statements (with their COMMENT) of the named
functions as src/sql/*.sql define them, as CREATE OR REPLACE: for an
upgrade script whose functions must equal a fresh install's
(tests/upgrade/test_extension_upgrade.py compares them).

    python3 scripts/upgrade_functions.py src/sql/leases.sql snowflake_lease_renew ...
"""

import re
import sys


def main() -> int:
    path, names = sys.argv[1], sys.argv[2:]
    text = open(path).read()
    for name in names:
        m = re.search(rf"^CREATE FUNCTION snowflake_id_internal\.{name}\(.*?^\$fn\$;\n"
                      rf"COMMENT ON FUNCTION snowflake_id_internal\.{name}\(.*?';\n",
                      text, re.M | re.S)
        if not m:
            print(f"no function {name} in {path}", file=sys.stderr)
            return 1
        print(m.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
