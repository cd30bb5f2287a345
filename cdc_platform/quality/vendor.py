"""The stylesheets, scripts and fonts of the Data Docs, from Python packages instead of CDNs.

GX's templates load Bootstrap 4.3.1, Popper, jQuery, Font Awesome, bootstrap-table,
bootstrap-datepicker, bootstrap-dark and Vega from public CDNs, and its logo from S3: offline,
a page renders unstyled. ``install`` copies what the XStatic packages ship to
``<site>/static/vendor/``; ``localize`` points a page's links there. What no package ships is
dropped: bootstrap-table (and its filter control and date picker) only draws GX's index page,
which ``pages.index`` replaces; Vega only draws the charts of distribution expectations, which no
suite of ours uses; bootstrap-dark only adds a dark theme.
"""

import re
import shutil
from pathlib import Path

from xstatic.pkg import bootstrap, font_awesome, jquery

VENDOR = Path("static", "vendor")
# Bootstrap 4.5 (the 4.x on PyPI; the templates want 4.3): its bundle has Popper built in.
BOOTSTRAP_CSS = VENDOR / "bootstrap" / "bootstrap.min.css"
BOOTSTRAP_JS = VENDOR / "bootstrap" / "bootstrap.bundle.min.js"
JQUERY_JS = VENDOR / "jquery" / "jquery.min.js"
FONT_AWESOME_CSS = VENDOR / "font-awesome" / "css" / "all.min.css"
FILES = {
    BOOTSTRAP_CSS: Path(bootstrap.BASE_DIR, "css", "bootstrap.min.css"),
    BOOTSTRAP_JS: Path(bootstrap.BASE_DIR, "js", "bootstrap.bundle.min.js"),
    JQUERY_JS: Path(jquery.BASE_DIR, "jquery.min.js"),
    FONT_AWESOME_CSS: Path(font_awesome.BASE_DIR, "css", "all.min.css"),
    **{  # all.min.css loads ../webfonts/*
        VENDOR / "font-awesome" / "webfonts" / f.name: f
        for f in Path(font_awesome.BASE_DIR, "webfonts").iterdir()
    },
}
# A CDN link's file name -> our copy; any other remote stylesheet or script is dropped.
LOCAL = {
    "bootstrap.min.css": BOOTSTRAP_CSS,
    "bootstrap.min.js": BOOTSTRAP_JS,
    "jquery-3.7.1.min.js": JQUERY_JS,
    "all.min.css": FONT_AWESOME_CSS,
}
REMOTE_TAG = re.compile(
    r'<(?:link|script)\b[^>]*?\b(?:href|src)="(?:https?:)?//[^"]*?([^/"?]*)(?:\?[^"]*)?"[^>]*>'
    r"(?:\s*</script>)?"
)
# GX's own images are in the site already (static/images), only its navbar takes them from S3.
GX_IMAGE = re.compile(r'"https://great-expectations-web-assets\.[^/"]+/([\w.-]+)(?:\?[^"]*)?"')


def install(site: Path) -> None:
    """Copy the packages' files into ``site`` (again when a package update changed one)."""
    for target, source in FILES.items():
        dest = site / target
        if not dest.exists() or dest.stat().st_size != source.stat().st_size:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)


def localize(html: str, depth: int) -> str:
    """``html`` of a page ``depth`` folders below the site's root, loading nothing remote."""
    up = "../" * depth

    def local(match: re.Match) -> str:
        ours = LOCAL.get(match.group(1))
        if ours is None:
            return ""
        if ours.suffix == ".css":
            return f'<link rel="stylesheet" href="{up}{ours.as_posix()}">'
        return f'<script src="{up}{ours.as_posix()}"></script>'

    html = REMOTE_TAG.sub(local, html)
    return GX_IMAGE.sub(lambda m: f'"{up}static/images/{m.group(1)}"', html)
