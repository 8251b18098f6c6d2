"""scripts/check_links.py: broken relative links and anchors are reported, good ones are not,
and the project's own README.md and docs/*.md pass."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_links.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import check_links  # noqa: E402


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


@pytest.fixture
def site(tmp_path):
    """A README and two pages whose links all resolve."""
    write(tmp_path / "docs" / "guide.md", """\
        # The guide

        ## Launching jobs: `tfhvdrun`

        ## Keras (`model.fit`)

        ## Repeated

        ## Repeated

        <a id="custom-spot"></a>
        """)
    write(tmp_path / "docs" / "picture.png", "not really a picture")
    readme = write(tmp_path / "README.md", """\
        # Project

        See [the guide](docs/guide.md), [launching](docs/guide.md#launching-jobs-tfhvdrun),
        [Keras](docs/guide.md#keras-modelfit), [the second](docs/guide.md#repeated-1),
        [a spot](docs/guide.md#custom-spot), [here](#project), ![pic](docs/picture.png)
        and [the web](https://example.org/a/b?c=d#e).

        [ref]: docs/guide.md#repeated
        """)
    return tmp_path, readme


def test_good_links_pass(site):
    _, readme = site
    assert check_links.check_files([readme]) == []


def test_broken_file_link_is_reported(site):
    root, _ = site
    page = write(root / "page.md", "Read [this](docs/missing.md) first.\n")
    problems = check_links.check_files([page])
    assert len(problems) == 1
    assert "docs/missing.md" in problems[0] and "no such file" in problems[0]
    assert problems[0].startswith(page + ":1:")


def test_broken_anchor_is_reported(site):
    root, _ = site
    page = write(root / "page.md", """\
        # Top

        [ok](docs/guide.md#keras-modelfit) and [bad](docs/guide.md#keras-model-fit)
        and [bad here](#bottom) and [third](docs/guide.md#repeated-2)
        """)
    problems = check_links.check_files([page])
    assert len(problems) == 3, problems
    assert "'#keras-model-fit'" in problems[0] and "guide.md" in problems[0]
    assert "'#bottom'" in problems[1]
    assert "'#repeated-2'" in problems[2]


def test_malformed_url_and_unknown_scheme_are_reported(site):
    root, _ = site
    page = write(root / "page.md", "[a](https://) [b](http://nodot/x) [c](ftp://example.org/f) "
                                   "[d](mailto:someone@example.org)\n")
    problems = check_links.check_files([page])
    assert len(problems) == 3, problems
    assert "malformed https URL" in problems[0]
    assert "malformed http URL" in problems[1]
    assert "unsupported scheme 'ftp:'" in problems[2]


def test_code_and_comments_are_not_links(site):
    root, _ = site
    page = write(root / "page.md", """\
        Inline `[not](missing.md)` code.

        ```markdown
        [not a link](missing.md)
        ```

        <!-- | Feature | [page](docs/x.md) | -->
        """)
    assert check_links.check_files([page]) == []


def test_github_anchors():
    assert check_links.github_anchor("Keras (`model.fit`)") == "keras-modelfit"
    assert check_links.github_anchor("Horovod's error classes") == "horovods-error-classes"
    assert check_links.github_anchor("Lone graph ops (`TFHVD_GRAPH_INLINE`)") == \
        "lone-graph-ops-tfhvd_graph_inline"
    assert check_links.github_anchor("Gloo against MPI (`tfhvdrun --gloo`)") == \
        "gloo-against-mpi-tfhvdrun---gloo"


def test_command_line_exit_codes(site):
    root, readme = site
    ok = subprocess.run([sys.executable, SCRIPT, readme], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = write(root / "bad.md", "[x](docs/guide.md#nowhere)\n")
    out = subprocess.run([sys.executable, SCRIPT, readme, bad], capture_output=True, text=True)
    assert out.returncode == 1
    assert "bad.md:1: docs/guide.md#nowhere" in out.stdout


def test_the_projects_docs_pass():
    out = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
