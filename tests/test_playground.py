"""The playground in a real browser: Debian's chromium, driven by selenium through Debian's
chromedriver (no browser download), against a real `dcoco serve --models tiny`.

Each speculation mode runs from the page's own URL (`?autorun=1`); what the page rendered is
checked against the usage of the very response it rendered (which the page writes into its
summary) and against the same request sent with the openai client: one span per completion
token, drafted + corrected spans = accepted_prediction_tokens, rejected-draft spans =
rejected_prediction_tokens. Greedy decoding in fp32 with fixed B (no adaptive planner), so
the three modes write the same text, raced side by side in one batch too.

Screenshots go to the folder in DCOCO_SCREENSHOTS (`make playground-screenshots` writes
docs/), else to a temporary folder.
"""

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from dcoco.paths import TINY_MODEL_NAME
from dcoco.serve import free_port
from stack import RedisServer, Service, http_status, wait_for

pytestmark = pytest.mark.slow
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PROMPT = "Write a Python function that returns the squares of a list of numbers."
MAX_TOKENS = 48
WAIT_S = 120


def require_browser() -> None:
    for tool in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: `make setup` installs chromium-driver")


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`dcoco serve --models tiny` (on our Redis, so a second gateway can join it); its URL."""
    port = free_port()
    env = dict(os.environ) | {
        "DCOCO_REDIS_URL": redis.url,
        "DCOCO_METRICS_PORT": str(free_port()),
        "DCOCO_PRECISION": "fp32",  # exact: every mode writes the target's own greedy text
        "DCOCO_ADAPTIVE": "false",  # fixed B: a request's acceptance does not depend on timing
    }
    env.pop("DCOCO_TARGET", None)
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("wb")
    serve = subprocess.Popen(
        [sys.executable, "-m", "dcoco", "serve", "--models", "tiny", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    assert serve.stdout is not None
    try:
        assert b"DCOCO is serving on" in serve.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("DCOCO_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service as Driver

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1360,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Driver(CHROMEDRIVER), options=options)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


def open_page(browser: Any, url: str, **params: str) -> None:
    browser.get(f"{url}/playground?{urllib.parse.urlencode(params)}")


def wait_finished(browser: Any) -> str:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.finished")
    )
    status = browser.find_element("id", "status").text
    assert browser.execute_script("return document.body.dataset.finished") == "ok", status
    return str(status)


def wait_ready(browser: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.ready")
    )


READ_PANES = """
return [...document.querySelectorAll('#panes .pane')].map((pane) => {
  const tokens = [...pane.querySelectorAll('.tokens .tok')];
  const count = (source) => tokens.filter((t) => t.dataset.provenance === source).length;
  return {
    mode: pane.dataset.mode,
    text: tokens.map((t) => t.textContent).join(''),
    tokens: tokens.length,
    drafted: count('drafted'), corrected: count('corrected'), target: count('target'),
    rejected: pane.querySelectorAll('.tokens .rejected .rej').length,
    rejectedShown: [...pane.querySelectorAll('.tokens .rejected')].some((r) => r.offsetParent),
    cycles: Math.max(0, ...tokens.map((t) => Number(t.dataset.cycle || 0))),
    summary: Object.assign({}, pane.querySelector('.summary').dataset),
  };
});
"""


def panes(browser: Any) -> list[dict[str, Any]]:
    return list(browser.execute_script(READ_PANES))


def check_against_usage(pane: dict[str, Any]) -> None:
    """What the page rendered adds up to the usage of the response it rendered."""
    summary = pane["summary"]
    assert pane["tokens"] == int(summary["completionTokens"]) > 0
    assert pane["drafted"] + pane["corrected"] == int(summary["acceptedTokens"])
    assert pane["rejected"] == int(summary["rejectedTokens"])
    expected_length = 1 + (pane["drafted"] + pane["corrected"]) / pane["cycles"]
    assert float(summary["acceptedLength"]) == pytest.approx(expected_length, abs=1e-4)
    if pane["mode"] == "off":
        assert pane["drafted"] == pane["corrected"] == pane["rejected"] == 0
        assert float(summary["acceptedLength"]) == 1.0
    if pane["mode"] == "dflash":
        assert pane["corrected"] == 0  # no corrector: every accepted draft is the top-1


def api_answer(url: str, mode: str) -> tuple[str, Any]:
    """The same request, sent with the official client: its text and usage."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=TINY_MODEL_NAME,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"speculation": mode},
    )
    return reply.choices[0].message.content or "", reply.usage


@pytest.mark.parametrize("mode", ["off", "dflash", "dcoco"])
def test_each_mode_renders_provenance_that_adds_up_to_usage(
    served: str, browser: Any, shots: Path, mode: str
) -> None:
    open_page(
        browser,
        served,
        model=TINY_MODEL_NAME,
        prompt=PROMPT,
        mode=mode,
        max_tokens=str(MAX_TOKENS),
        rejected="1",
        autorun="1",
    )
    wait_finished(browser)
    [pane] = panes(browser)
    assert pane["mode"] == mode
    check_against_usage(pane)
    assert pane["rejectedShown"] == (pane["rejected"] > 0)  # the toggle is on
    text, usage = api_answer(served, mode)
    assert pane["text"] == text  # greedy, fp32: the same answer as through the API
    assert pane["tokens"] == usage.completion_tokens
    details = usage.completion_tokens_details
    assert pane["drafted"] + pane["corrected"] == details.accepted_prediction_tokens
    assert pane["rejected"] == details.rejected_prediction_tokens
    if mode == "dcoco":
        browser.execute_script("document.querySelector('#panes .tokens').scrollTop = 0")
        browser.save_screenshot(str(shots / "playground.png"))


def test_the_race_runs_three_modes_side_by_side_and_ends_with_their_times(
    served: str, browser: Any, shots: Path
) -> None:
    open_page(
        browser,
        served,
        model=TINY_MODEL_NAME,
        prompt=PROMPT,
        max_tokens=str(MAX_TOKENS),
        race="1",
        autorun="1",
    )
    wait_finished(browser)
    found = panes(browser)
    assert [p["mode"] for p in found] == ["off", "dflash", "dcoco"]
    for pane in found:
        check_against_usage(pane)
        assert not pane["rejectedShown"]  # the toggle is off
    assert len({p["text"] for p in found}) == 1  # in one batch, each is the target's own text
    times = json.loads(browser.find_element("id", "race-result").get_attribute("data-times"))
    assert set(times) == {"off", "dflash", "dcoco"}
    assert all(seconds > 0 for seconds in times.values())
    assert "Finished:" in browser.find_element("id", "race-result").text
    browser.save_screenshot(str(shots / "playground-race.png"))


HOSTILE_STREAM = """
const evil = ['<img src=x onerror="window.pwned=1">', '<script>window.pwned=2</script>',
  '&lt;b&gt;'];
const sse = (body) => 'data: ' + JSON.stringify(body) + '\\n\\n';
const head = {id: 'x', object: 'chat.completion.chunk', created: 0, model: 'm'};
window.fetch = async (url, init) => {
  if (!String(url).includes('/v1/chat/completions')) return window.realFetch(url, init);
  const parts = evil.map((text, i) => ({cycle: i + 1,
    tokens: [{id: i, text, source: 'drafted'}], rejected: [{id: 9, text: '<iframe src="/">'}]}));
  const chunks = parts.map((part) => sse({...head, choices: [{index: 0,
    delta: {content: part.tokens[0].text}, logprobs: null, finish_reason: null,
    provenance: part}]}));
  const usage = {prompt_tokens: 1, completion_tokens: 3, total_tokens: 4,
    completion_tokens_details: {accepted_prediction_tokens: 3, rejected_prediction_tokens: 3}};
  const body = chunks.join('') + sse({...head, choices: [], usage}) + 'data: [DONE]\\n\\n';
  return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
};
"""


def test_model_output_is_rendered_as_text_never_as_markup(served: str, browser: Any) -> None:
    open_page(browser, served, model=TINY_MODEL_NAME, rejected="1")
    wait_ready(browser)
    browser.execute_script("window.realFetch = window.fetch;" + HOSTILE_STREAM)
    browser.find_element("id", "run").click()
    wait_finished(browser)
    [pane] = panes(browser)
    assert (
        pane["text"]
        == '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>&lt;b&gt;'
    )
    check_against_usage(pane)
    found = browser.execute_script(
        "return document.querySelectorAll('#panes img, #panes script, #panes iframe').length"
    )
    assert found == 0
    assert browser.execute_script("return window.pwned") is None


def test_it_is_usable_from_the_keyboard(served: str, browser: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    open_page(browser, served, model=TINY_MODEL_NAME, max_tokens="8")
    wait_ready(browser)
    prompt = browser.find_element("id", "prompt")
    prompt.clear()
    prompt.send_keys("def add(a, b):")
    prompt.send_keys(Keys.CONTROL, Keys.ENTER)  # runs without the mouse
    wait_finished(browser)
    [pane] = panes(browser)
    check_against_usage(pane)
    browser.find_element("id", "show-rejected").send_keys(Keys.SPACE)  # the toggle, by key
    assert browser.execute_script(
        "return document.getElementById('panes').classList.contains('show-rejected')"
    )
    focusable = browser.execute_script(
        "return ['model','mode','max-tokens','temperature','prompt','run','race','show-rejected']"
        ".every((id) => { const e = document.getElementById(id); e.focus(); "
        "return document.activeElement === e; })"
    )
    assert focusable


def test_it_fits_a_phone_screen(served: str, browser: Any, shots: Path) -> None:
    size = browser.get_window_size()
    browser.set_window_size(390, 844)
    try:
        open_page(browser, served, model=TINY_MODEL_NAME, prompt=PROMPT, autorun="1", race="1")
        wait_finished(browser)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{overflow} px of horizontal scrolling at phone width"
        browser.execute_script("document.getElementById('race-result').scrollIntoView()")
        browser.save_screenshot(str(shots / "playground-phone.png"))
    finally:
        browser.set_window_size(size["width"], size["height"])


def test_with_api_keys_it_asks_for_one_and_keeps_it_in_the_tab(
    served: str, redis: RedisServer, browser: Any, tmp_path: Path
) -> None:
    """A second gateway on the same Redis, with keys on."""
    port = free_port()
    env = {"DCOCO_REDIS_URL": redis.url, "DCOCO_PORT": str(port), "DCOCO_API_KEYS": "s3cret"}
    gateway = Service("gateway", env, tmp_path / "gateway.log").start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_status(f"{url}/healthz") == 200, what="the gateway with keys")
        open_page(browser, url, model=TINY_MODEL_NAME, max_tokens="8")
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(browser, 30).until(lambda d: d.find_element("id", "key-row").is_displayed())
        assert browser.execute_script("return document.body.dataset.ready") == "false"
        browser.find_element("id", "key").send_keys("s3cret")
        browser.find_element("id", "key-save").click()
        WebDriverWait(browser, 30).until(
            lambda d: not d.find_element("id", "key-row").is_displayed()
        )
        browser.find_element("id", "run").click()
        wait_finished(browser)
        check_against_usage(panes(browser)[0])
        stored = browser.execute_script(
            "return [sessionStorage.getItem('dcoco-api-key'), localStorage.length, document.cookie]"
        )
        assert stored == ["s3cret", 0, ""]  # in this tab's session storage only
    finally:
        browser.execute_script("sessionStorage.clear()")
        gateway.stop()
