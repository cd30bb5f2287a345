from cdc_platform.cli import main

raise SystemExit(main())
