from benchmarks.scale.cli import main

raise SystemExit(main())
