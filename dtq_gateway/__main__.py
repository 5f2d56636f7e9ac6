"""``python -m dtq_gateway``: same as the ``dtq-gateway`` console script."""

import sys

from dtq_gateway.cli import main

sys.exit(main())
