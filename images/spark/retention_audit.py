"""The retention audit as spark-submit's Python application in the `gregor-spark` image
(`local:///opt/gregor/retention_audit.py`): `gregor audit retention`, in the session
spark-submit configured (gregor_audit.submit)."""

import sys

from gregor_audit.cli import main

sys.exit(main(sys.argv[1:]))
