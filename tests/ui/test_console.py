"""The console in a real browser: sign in, submit the tiny example, watch it succeed, and check
that what the charts plot is what the API recorded. One real training job in all."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import Page, Route, expect
from sqlmodel import Session

from service.db.session import get_engine
from service.db.users import create_user
from tests.e2e.stack import Stack
from tests.integration.helpers import REPO, auth

pytestmark = pytest.mark.slow
STEPS = 8


def example_yaml() -> str:
    """examples/tiny-gpt.yaml as a user would paste it, with fewer steps and its folder."""
    spec = yaml.safe_load((REPO / "examples" / "tiny-gpt.yaml").read_text())
    spec["args"] = ["--steps", str(STEPS), "--checkpoint-interval", "4"]
    spec["working_dir"] = str(REPO / "examples")
    return yaml.safe_dump(spec, sort_keys=False)


def sign_in(page: Page, url: str, token: str) -> None:
    page.goto(f"{url}/console")
    page.fill("#token", token)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#who")).to_have_text("alice · vision")


def plotted(page: Page, chart: str) -> tuple[dict[str, float], list[dict[str, float]]]:
    """The chart's scale and every point it drew, as the browser has them."""
    scale = page.eval_on_selector(
        chart, "svg => Object.fromEntries(Object.entries(svg.dataset).map(([k, v]) => [k, +v]))"
    )
    points = page.eval_on_selector_all(
        f"{chart} circle.point",
        """els => els.map(e => ({step: +e.dataset.step, value: +e.dataset.value,
                                 cx: +e.getAttribute('cx'), cy: +e.getAttribute('cy')}))""",
    )
    return scale, points


def assert_plots(scale: dict[str, float], points: list[dict[str, float]], recorded: list) -> None:  # type: ignore[type-arg]
    assert [(p["step"], p["value"]) for p in points] == recorded
    for p in points:  # each point sits where the recorded value maps on the drawn axes
        x = scale["left"] + scale["width"] * (p["step"] - scale["x0"]) / (scale["x1"] - scale["x0"])
        y = scale["top"] + scale["height"] * (
            1 - (p["value"] - scale["y0"]) / (scale["y1"] - scale["y0"])
        )
        assert abs(p["cx"] - x) < 0.01 and abs(p["cy"] - y) < 0.01


def test_console_submits_the_example_and_plots_what_the_api_recorded(
    page: Page, stack: Stack, token: str, postgres_url: str, artifacts: Path
) -> None:
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    page.on("dialog", lambda dialog: dialog.accept())  # "Cancel job ...?"
    violations: list[str] = []
    page.on(
        "console", lambda m: violations.append(m.text) if "Content Security" in m.text else None
    )
    http = httpx.Client(base_url=stack.url, headers=auth(token), timeout=30)
    _quota_of_two_gpus(stack.url, postgres_url)  # the example holds both while it trains
    stack.start_worker("w1")
    sign_in(page, stack.url, token)

    page.click("#submit-card summary")
    page.fill("#spec", example_yaml())
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[0-9a-f]{16}$"))
    job_id = page.url.rsplit("/", 1)[1]

    _a_second_job_waits_in_the_queue_and_is_cancelled(page, http, artifacts)
    page.goto(f"{stack.url}/console#/jobs/{job_id}")
    expect(page.locator("#job-head .status")).to_have_text("SUCCEEDED", timeout=420_000)

    metrics = http.get(f"/v1/jobs/{job_id}/metrics").json()
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    expect(page.locator("#loss-chart circle.point")).to_have_count(STEPS)
    assert_plots(*plotted(page, "#loss-chart"), [(m["step"], m["loss"]) for m in metrics])
    rates = [(m["step"], m["tokens_per_s"]) for m in metrics]
    assert_plots(*plotted(page, "#rate-chart"), rates)
    expect(page.locator("#log")).to_contain_text(f"step {STEPS} loss")
    expect(page.locator("#job-checkpoints")).to_contain_text("global_step8")
    # The worker's retention pass measured them (it may follow the exit by a tick or two)
    kept = re.compile(r"Checkpoints \(\d+ kept, (?!0\.00)[0-9.]+ MiB; \d+ deleted\)")
    expect(page.locator("#job-checkpoints h2")).to_have_text(kept, timeout=60_000)
    expect(page.locator("#job-attempts")).to_contain_text("attempt 1")
    page.screenshot(path=artifacts / "job.png", full_page=True)

    page.click("a[data-nav=jobs]")
    expect(page.locator(f"tr[data-job='{job_id}'] .status")).to_have_text("SUCCEEDED")
    expect(page.locator("#jobs .status")).to_have_text(["CANCELLED", "SUCCEEDED"])
    page.screenshot(path=artifacts / "jobs.png", full_page=True)

    advice = _advisor(page, http)
    page.screenshot(path=artifacts / "advisor.png", full_page=True)
    with page.expect_download() as download:
        page.click("#download-ds-config")
    assert json.loads(Path(download.value.path()).read_text()) == advice["plan"]["ds_config"]
    _advisor_reads_a_hugging_face_config(page, http)
    page.screenshot(path=artifacts / "advisor-hf-config.png", full_page=True)

    page.click("a[data-nav=teams]")
    expect(page.locator("#teams tr[data-team=vision]")).to_contain_text("0 / 2")
    expect(page.locator("#queue")).to_contain_text("Nothing waits for admission.")

    assert urls and not [url for url in urls if token in url]  # the token never rides a URL
    assert violations == []  # the page works under its own Content-Security-Policy


def _quota_of_two_gpus(url: str, database_url: str) -> None:
    with Session(get_engine(database_url)) as session:
        admin = create_user(session, "root", "ops", is_admin=True)
        session.commit()
    response = httpx.patch(f"{url}/v1/teams/vision", json={"gpu_quota": 2}, headers=auth(admin))
    assert response.status_code == 200, response.text


def _a_second_job_waits_in_the_queue_and_is_cancelled(
    page: Page, http: httpx.Client, artifacts: Path
) -> None:
    """While the example holds the team's two GPUs, a second job waits; the queue says why,
    and its page cancels it (it never trains)."""
    second = http.post("/v1/jobs", json=yaml.safe_load(example_yaml())).json()
    assert second["status"] == "PENDING"
    page.click("a[data-nav=teams]")
    row = page.locator("#queue tr").first
    expect(row).to_contain_text("tiny-gpt")
    expect(row.locator("td").first).to_have_text("1")
    expect(row).to_contain_text("team vision holds 2 of its 2-GPU quota; this job needs 2")
    expect(page.locator("#teams tr[data-team=vision]")).to_contain_text("2 / 2")
    page.screenshot(path=artifacts / "teams.png", full_page=True)
    row.click()
    expect(page.locator("#job-head .status")).to_have_text("PENDING")
    page.click("#cancel")
    expect(page.locator("#job-head .status")).to_have_text("CANCELLED")
    assert http.get(f"/v1/jobs/{second['id']}").json()["status"] == "CANCELLED"


def _advisor(page: Page, http: httpx.Client) -> dict[str, Any]:
    page.click("a[data-nav=advisor]")
    page.fill("#advice-spec", example_yaml())
    page.click("#advise")
    advice: dict[str, Any] = http.post("/v1/advice", json=yaml.safe_load(example_yaml())).json()
    plan = advice["plan"]
    chosen = page.locator("#advice-plan h2")
    expect(chosen).to_contain_text(f"ZeRO-{plan['zero_stage']} ")
    expect(chosen).to_contain_text(
        f"mb={plan['micro_batch_size']}\u00d7{plan['gradient_accumulation_steps']}"
    )
    stages = {c["zero_stage"] for c in advice["candidates"]}
    expect(page.locator(".stage")).to_have_count(len(stages))
    expect(page.locator(".candidate.chosen")).to_have_count(1)
    return advice


def _advisor_reads_a_hugging_face_config(page: Page, http: httpx.Client) -> None:
    """A small Llama's config.json uploaded on the advisor page becomes the spec's model."""
    llama = json.loads((REPO / "examples" / "llama-7b" / "config.json").read_text())
    small = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512}
    config = {**llama, **small, "num_attention_heads": 4, "num_key_value_heads": 4}
    spec = {**yaml.safe_load(example_yaml()), "model": {"hf_config": config}}
    plan = http.post("/v1/advice", json=spec).json()["plan"]
    with page.expect_response(lambda response: response.url.endswith("/v1/advice")) as asked:
        page.set_input_files(
            "#hf-config",
            files=[
                {
                    "name": "config.json",
                    "mimeType": "application/json",
                    "buffer": json.dumps(config).encode(),
                }
            ],
        )
    assert asked.value.json()["plan"] == plan  # the page asked with the uploaded config
    expect(page.locator("#advice-spec")).to_have_value(re.compile('"hf_config"'))
    label = page.locator("#advice-plan h2")
    expect(label).to_contain_text(f"mb={plan['micro_batch_size']}\u00d7")
    expect(label).to_contain_text(f"ZeRO-{plan['zero_stage']} ")


def test_a_page_left_while_it_loads_does_not_paint_over_the_next(
    page: Page, stack: Stack, token: str
) -> None:
    """A job's page whose data arrives after the user went to Teams must not replace Teams
    (under load CI saw exactly that: the job page painted over the queue)."""
    http = httpx.Client(base_url=stack.url, headers=auth(token), timeout=30)
    job_id = http.post("/v1/jobs", json=yaml.safe_load(example_yaml())).json()["id"]
    sign_in(page, stack.url, token)
    held: list[Route] = []
    page.route(f"**/v1/jobs/{job_id}", lambda route: held.append(route))  # held until released

    page.evaluate(f"location.hash = '#/jobs/{job_id}'")
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the job page never asked for its job"
    page.click("a[data-nav=teams]")
    expect(page.locator("main h1")).to_have_text("Teams")
    held[0].continue_()  # the job page's data arrives now, too late
    page.wait_for_timeout(1500)  # a poll of its own (every 2 s) would also have started by now

    expect(page.locator("main h1")).to_have_text("Teams")
    expect(page.locator("#job-head")).to_have_count(0)
