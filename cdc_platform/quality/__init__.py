"""Data quality: GX suites (``expectations/``), validation frames, Data Docs and redrive.

Importing this package never imports Great Expectations (it takes seconds): only
``quality.validate`` and ``quality.docs`` do, when a validation runs.
"""
