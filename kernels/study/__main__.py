"""``python -m zipkv.kernels.study``: the offline page-format study (kernels/study/cli.py)."""

from zipkv.kernels.study.cli import main

raise SystemExit(main())
