import sys

from dancegrpo_npu.cli import main

sys.exit(main())
