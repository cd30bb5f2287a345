from cdc_platform.cli import main

if __name__ == "__main__":  # python -m cdc_platform; importing the module runs nothing
    raise SystemExit(main())
