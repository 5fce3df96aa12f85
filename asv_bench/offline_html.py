"""Make ``asv publish``'s page work offline: serve its libraries from installed npm packages.

asv 0.6's page (``<html_dir>/index.html``) loads jQuery, flot and its plugins, Bootstrap,
stupidtable and blueimp-md5 from CDNs; offline a failed load sends the browser to error.html, so
nothing is shown. This step, run by ``make publish`` after ``asv publish``:

1. installs the npm packages of asv_bench/www/package.json (exact versions, locked with integrity
   hashes in package-lock.json) into ``<vendor_dir>`` with ``npm ci``, unless already there;
2. copies the files the page needs into ``<html_dir>/vendor/`` (Bootstrap's fonts with its CSS);
3. rewrites every CDN ``<script>``/``<link>`` of index.html to the local copy (without the
   ``integrity``/``crossorigin`` attributes, which make browsers refuse file:// loads).

Where our file is the very file asv pins (same package, version and path: jQuery 3.3.1,
Bootstrap 3.1.1 JS and CSS, flot-orderbars 1.0.0, blueimp-md5 2.19.0), its hash is checked against
asv's ``integrity`` attribute and a mismatch is an error. Two are not byte-identical, by
necessity: flot 0.8.3 comes as npm's unminified source (asv loads cdnjs's minified build of the
same release), and stupidtable is stupid-table-plugin 1.1.3 (asv loads 1.0.1, never published on
npm; the $.fn.stupidtable API asv calls is the same). No PyPI package ships flot 0.8 or these
plugins, hence npm. A CDN URL in index.html that is not in ``ASSETS`` (a newer asv) is an error
naming it, rather than a page that silently goes blank offline.

Usage: ``python -m asv_bench.offline_html [--html-dir .asv/html] [--vendor-dir .asv/www-vendor]``.
Without npm on PATH (and no vendor dir) the page is left as asv wrote it (it then needs the
network) and a warning says so; exit status 0, so ``make publish`` still publishes.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Where package.json and package-lock.json live (part of the repository).
WWW_DIR = Path(__file__).resolve().parent / "www"
#: Where the rewritten page finds the libraries, relative to index.html.
VENDOR_SUBDIR = "vendor"


@dataclass(frozen=True)
class Asset:
    """One CDN file of asv's page and the npm package file that replaces it.

    path: inside node_modules; dest: under <html_dir>/vendor/; identical: our file is the very
    file asv pins, so asv's integrity hash must match it.
    """

    url: str
    path: str
    dest: str
    identical: bool


ASSETS = (
    Asset("https://code.jquery.com/jquery-3.3.1.min.js", "jquery/dist/jquery.min.js", "jquery.min.js", True),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js", "flot/jquery.flot.js",
          "flot/jquery.flot.js", False),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js", "flot/jquery.flot.time.js",
          "flot/jquery.flot.time.js", False),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js",
          "flot/jquery.flot.selection.js", "flot/jquery.flot.selection.js", False),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js",
          "flot/jquery.flot.categories.js", "flot/jquery.flot.categories.js", False),
    Asset("https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js",
          "flot-orderbars/js/jquery.flot.orderBars.js", "flot/jquery.flot.orderBars.js", True),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js",
          "stupid-table-plugin/stupidtable.min.js", "stupidtable.min.js", False),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js", "blueimp-md5/js/md5.min.js",
          "md5.min.js", True),
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js", "bootstrap/dist/js/bootstrap.min.js",
          "bootstrap/js/bootstrap.min.js", True),
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css",
          "bootstrap/dist/css/bootstrap.min.css", "bootstrap/css/bootstrap.min.css", True),
)
#: Directories copied whole beside an asset (Bootstrap's CSS refers to ../fonts/).
EXTRA_DIRS = {"bootstrap/dist/fonts": "bootstrap/fonts"}

_TAG = re.compile(r"<(script|link)\b[^>]*?\b(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", re.IGNORECASE)
_INTEGRITY = re.compile(r"\bintegrity=\"([^\"]+)\"")


class OfflineError(RuntimeError):
    """The page cannot be made to work offline (a message says what to do)."""


def _sri(data: bytes, spec: str) -> bool:
    """Whether ``data`` matches a Subresource Integrity value like "sha256-<base64>"."""
    algo, _, want = spec.partition("-")
    if algo not in ("sha256", "sha384", "sha512"):
        raise OfflineError(f"unknown integrity algorithm {algo!r} in {spec!r}")
    return base64.b64encode(hashlib.new(algo, data).digest()).decode() == want


def install_vendor(vendor_dir: Path, npm: str | None = None) -> bool:
    """``npm ci`` the locked packages into ``vendor_dir`` unless they are there; False without npm."""
    modules = vendor_dir / "node_modules"
    if all((modules / a.path).is_file() for a in ASSETS):
        return True
    npm = npm or shutil.which("npm")
    if npm is None:
        return False
    vendor_dir.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(WWW_DIR / name, vendor_dir / name)
    subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefix", str(vendor_dir)],
                   check=True, stdout=subprocess.DEVNULL)
    return True


def rewrite(html: str) -> tuple[str, list[str]]:
    """index.html with every CDN tag of ASSETS pointing at vendor/; also the URLs replaced.

    OfflineError for a CDN tag that ASSETS does not know (the page would break offline).
    """
    by_url = {a.url: a for a in ASSETS}
    unknown = [m.group(2) for m in _TAG.finditer(html) if m.group(2) not in by_url]
    if unknown:
        raise OfflineError(f"index.html loads {', '.join(unknown)}, which asv_bench/offline_html.py does not "
                           "provide (a newer asv?): add it to ASSETS and asv_bench/www/package.json")
    replaced: list[str] = []

    def local(m: re.Match) -> str:
        asset = by_url[m.group(2)]
        replaced.append(asset.url)
        src = f"{VENDOR_SUBDIR}/{asset.dest}"
        if m.group(1).lower() == "link":
            return f'<link rel="stylesheet" href="{src}">'
        return f'<script src="{src}" onerror="js_load_failure()">'

    return _TAG.sub(local, html), replaced


def vendor_page(html_dir: Path, modules: Path) -> list[str]:
    """Copy the assets from ``modules`` (a node_modules) into ``html_dir``/vendor and rewrite
    index.html; returns one line per asset saying whether it is asv's pinned file."""
    index = html_dir / "index.html"
    if not index.is_file():
        raise OfflineError(f"{index} not found: run `asv publish` first")
    html = index.read_text(encoding="utf-8")
    integrity = {m.group(2): _INTEGRITY.search(m.group(0)) for m in _TAG.finditer(html)}
    new_html, replaced = rewrite(html)
    lines = []
    for asset in ASSETS:
        src = modules / asset.path
        if not src.is_file():
            raise OfflineError(f"{src} missing: re-run with npm on PATH, or delete {modules.parent} and retry")
        data = src.read_bytes()
        spec = integrity.get(asset.url)
        if asset.identical and spec is not None:
            if not _sri(data, spec.group(1)):
                raise OfflineError(f"{src} does not match asv's pinned {asset.url} ({spec.group(1)})")
            how = "identical to asv's pinned file (integrity hash checked)"
        else:
            how = "same library, npm's build" if asset.identical else "npm's file (not the CDN's build)"
        dest = html_dir / VENDOR_SUBDIR / asset.dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        lines.append(f"{asset.dest}: {how}" + ("" if asset.url in replaced else " (not referenced by this asv)"))
    for src_dir, dest_dir in EXTRA_DIRS.items():
        shutil.copytree(modules / src_dir, html_dir / VENDOR_SUBDIR / dest_dir, dirs_exist_ok=True)
    index.write_text(new_html, encoding="utf-8")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asv_bench.offline_html", description=__doc__.split("\n")[0])
    parser.add_argument("--html-dir", type=Path, default=Path(".asv/html"), help="asv's html_dir (default .asv/html)")
    parser.add_argument("--vendor-dir", type=Path, default=Path(".asv/www-vendor"),
                        help="where npm installs the libraries (default .asv/www-vendor)")
    args = parser.parse_args(argv)
    if not install_vendor(args.vendor_dir):
        print("offline_html: npm not found, so the published page loads its libraries from the web "
              "(asv's default); install Node.js (npm) and re-run `make publish` for an offline page",
              file=sys.stderr)
        return 0
    try:
        lines = vendor_page(args.html_dir, args.vendor_dir / "node_modules")
    except OfflineError as exc:
        print(f"offline_html: {exc}", file=sys.stderr)
        return 1
    print(f"offline_html: {args.html_dir / 'index.html'} now loads its libraries from {VENDOR_SUBDIR}/:")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
