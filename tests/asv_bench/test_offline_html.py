"""The offline step of `make publish`: every CDN library of asv's page is replaced by a local file,
pinned files are checked against asv's integrity hashes, and an unknown CDN URL is refused."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from asv_bench import offline_html
from asv_bench.offline_html import ASSETS, OfflineError, rewrite, vendor_page

CDN = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"https?://", re.IGNORECASE)


def _asv_index() -> str:
    spec = importlib.util.find_spec("asv")
    if spec is None:
        pytest.skip("asv is not installed")
    return (Path(spec.origin).parent / "www" / "index.html").read_text(encoding="utf-8")


def _sri(data: bytes) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode()


def _fake_modules(tmp_path: Path) -> Path:
    modules = tmp_path / "node_modules"
    for asset in ASSETS:
        f = modules / asset.path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"/* {asset.path} */")
    fonts = modules / "bootstrap/dist/fonts"
    fonts.mkdir(parents=True)
    (fonts / "glyphicons-halflings-regular.woff").write_bytes(b"font")
    return modules


def test_installed_asv_page_has_no_cdn_tag_left():
    html, replaced = rewrite(_asv_index())
    assert CDN.search(html) is None
    assert sorted(replaced) == sorted(a.url for a in ASSETS)  # every asset is one asv loads
    assert "integrity=" not in html and "crossorigin=" not in html
    for asset in ASSETS:
        assert f'"vendor/{asset.dest}"' in html


def test_unknown_cdn_url_is_refused():
    page = '<html><script src="https://cdn.example.org/new-lib.js"></script></html>'
    with pytest.raises(OfflineError, match="new-lib.js"):
        rewrite(page)


def test_vendor_page_copies_checks_and_rewrites(tmp_path):
    modules = _fake_modules(tmp_path)
    tags = []
    for asset in ASSETS:
        data = (modules / asset.path).read_bytes()
        integrity = f' integrity="{_sri(data)}" crossorigin="anonymous"'
        if asset.url.endswith(".css"):
            tags.append(f'<link rel="stylesheet" href="{asset.url}"{integrity}>')
        else:
            tags.append(f'<script src="{asset.url}"{integrity} onerror="js_load_failure()"></script>')
    html_dir = tmp_path / "html"
    html_dir.mkdir()
    (html_dir / "index.html").write_text("<html><head>" + "\n".join(tags) + '<script src="asv.js"></script></head>')
    lines = vendor_page(html_dir, modules)
    out = (html_dir / "index.html").read_text()
    assert CDN.search(out) is None and '<script src="asv.js">' in out
    for asset in ASSETS:
        assert (html_dir / "vendor" / asset.dest).read_bytes() == (modules / asset.path).read_bytes()
    assert (html_dir / "vendor/bootstrap/fonts/glyphicons-halflings-regular.woff").read_bytes() == b"font"
    checked = [line for line in lines if "integrity hash checked" in line]
    assert len(checked) == sum(a.identical for a in ASSETS)


def test_pinned_file_with_wrong_hash_is_refused(tmp_path):
    modules = _fake_modules(tmp_path)
    jquery = next(a for a in ASSETS if a.identical)
    html_dir = tmp_path / "html"
    html_dir.mkdir()
    (html_dir / "index.html").write_text(f'<script src="{jquery.url}" integrity="{_sri(b"other bytes")}"></script>')
    with pytest.raises(OfflineError, match="does not match"):
        vendor_page(html_dir, modules)


def test_missing_page_or_file_is_an_error(tmp_path):
    with pytest.raises(OfflineError, match="asv publish"):
        vendor_page(tmp_path, tmp_path / "node_modules")
    (tmp_path / "index.html").write_text("<html></html>")
    with pytest.raises(OfflineError, match="missing"):
        vendor_page(tmp_path, tmp_path / "node_modules")


def test_without_npm_the_page_is_left_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(offline_html.shutil, "which", lambda name: None)
    (tmp_path / "html").mkdir()
    (tmp_path / "html/index.html").write_text("<html>asv</html>")
    assert offline_html.main(["--html-dir", str(tmp_path / "html"), "--vendor-dir", str(tmp_path / "v")]) == 0
    assert "npm not found" in capsys.readouterr().err
    assert (tmp_path / "html/index.html").read_text() == "<html>asv</html>"


def test_package_json_pins_the_versions_of_the_urls():
    deps = json.loads((offline_html.WWW_DIR / "package.json").read_text())["dependencies"]
    lock = json.loads((offline_html.WWW_DIR / "package-lock.json").read_text())["packages"]
    for asset in ASSETS:
        package = asset.path.split("/")[0]
        assert lock[f"node_modules/{package}"]["version"] == deps[package]
        if asset.identical or package == "flot":  # the URL names the very version we install
            assert deps[package] in asset.url, (asset.url, deps[package])
