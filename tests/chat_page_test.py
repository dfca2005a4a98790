#!/usr/bin/env python3
"""Browser test of `tessera serve`'s chat page (GET /): headless Chromium driven by selenium.

Usage: chat_page_test.py TESSERA_BINARY [--screenshot PNG]
  (tests/chat_page_test.sh makes the venv and runs it; ctest ChatPageE2E)

Checks, on a tiny synthetic model behind --api-key: GET / is HTML with no external
references, served without the key; a question sent without the key shows the server's 401
as an error line and gives the text back to the input; with the key, temperature 0 and max
tokens 24 typed into the page's fields, the streamed answer shown equals the non-streamed
greedy answer of the API for the same messages, with tokens/s, time to first token and the
prompt's token count shown; a second turn sends the conversation (its answer and prompt
token count equal the API's for the three messages); "New chat" forgets it. On the default
model: the answer shown equals the API's (real text), an answer is shown while it streams,
and Stop aborts it (the server frees the slot long before max tokens). --screenshot PNG: instead, a two-turn conversation on the default
model, saved as a screenshot (docs/chat_page.png).
"""
import http.client
import json
import os
import re
import sys
import time

# serve_e2e.py reads the binary from argv[1] too; its Server helper and tiny model are shared.
import serve_e2e as e2e
from serve_e2e import KEY, Server, check, failures


from headless_chromium import chrome  # noqa: E402 (exits 77 when Chromium or selenium is missing)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def wait(driver, timeout):
    return WebDriverWait(driver, timeout, poll_frequency=0.02)


def browser(width=1000, height=700):
    d = chrome(width, height + 150)
    # The viewport itself width x height (--window-size counts the window's frame too).
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    d.set_script_timeout(30)
    return d


class Page:
    """The chat page in a browser, through the ids it gives its controls."""

    def __init__(self, driver, port):
        self.d = driver
        driver.get(f"http://127.0.0.1:{port}/")
        wait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")

    def el(self, id_):
        return self.d.find_element(By.ID, id_)

    def set_field(self, id_, value):
        e = self.el(id_)
        e.clear()
        e.send_keys(value)
        self.d.execute_script("arguments[0].dispatchEvent(new Event('change'))", e)

    def answers(self):
        return self.d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")

    def ask(self, text, timeout=30):
        """Types `text`, presses Send and waits for the answer to finish; returns its element."""
        n = len(self.answers())
        self.el("prompt").send_keys(text)
        self.el("send").click()
        wait(self.d, timeout).until(lambda d: len(self.answers()) == n + 1)
        a = self.answers()[n]
        wait(self.d, timeout).until(lambda d: a.get_attribute("data-finish"))
        return a

    def text(self, answer):
        # textContent, not Selenium's .text (which folds whitespace): the exact string shown.
        return self.d.execute_script("return arguments[0].querySelector('.content').textContent", answer)

    def stats(self, answer):
        s = answer.find_elements(By.CSS_SELECTOR, ".stats")
        return (s[0].text, {k: s[0].get_attribute("data-" + k) for k in ["tps", "ttft-ms", "prompt-tokens",
                                                                           "completion-tokens"]}) if s else ("", {})


servers = []  # every server started, stopped at the end whatever happened


def start(model_args, extra=()):
    s = Server(model_args, extra)
    servers.append(s)
    s.wait_ready()
    return s


def get_page(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, r.getheader("Content-Type", ""), r.getheader("Content-Security-Policy", ""), body


def api_answer(server, messages, n):
    status, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0})
    assert status == 200, (status, body)
    j = json.loads(body)
    return j["choices"][0]["message"]["content"], j["usage"], j["choices"][0]["finish_reason"]


def test_tiny(model):
    s = start([model], ["--parallel", "2", "--ctx-size", "512", "--api-key", KEY])
    status, ctype, csp, page = get_page(s.port)
    check(status == 200 and ctype.startswith("text/html"), f"GET / without the key: 200 text/html ({status} {ctype})")
    external = re.findall(r"""https?://|(?:src|href)\s*=\s*["']?\s*//|@import|url\(""", page)
    check(not external, f"the page references nothing outside itself ({external})")
    check("connect-src 'self'" in csp, "the page is served with a same-origin Content-Security-Policy")

    d = browser()
    try:
        p = Page(d, s.port)
        n = 24
        p.set_field("temperature", "0")
        p.set_field("max-tokens", str(n))
        q1, q2 = "What is the capital of France?", "And of Italy?"

        # Without the key: the server's 401 as an error line; the question goes back to the input.
        a = p.ask(q1)
        err = a.find_elements(By.CSS_SELECTOR, ".error")
        check(a.get_attribute("data-finish") == "error" and err and "401" in err[0].text,
              f"without the key: the 401 is shown ({err[0].text if err else 'no error line'})")
        check(p.el("prompt").get_attribute("value") == q1, "the unsent question is back in the input")
        p.el("prompt").clear()
        p.el("new-chat").click()

        p.set_field("api-key", KEY)
        a1 = p.ask(q1)
        shown1 = p.text(a1)
        ref1, usage1, finish1 = api_answer(s, [{"role": "user", "content": q1}], n)
        check(shown1 == ref1 and shown1, f"turn 1: the streamed answer shown equals the API's greedy answer ({shown1!r})")
        check(a1.get_attribute("data-finish") == finish1, f"turn 1's finish reason as the API's ({finish1})")
        text, st = p.stats(a1)
        check(re.search(r"\d+(\.\d+)? tokens/s", text) is not None and float(st["tps"] or 0) > 0,
              f"turn 1: tokens/s shown ({text!r})")
        check(re.search(r"first token \d+ ms", text) is not None and st["ttft-ms"] != "", "turn 1: time to first token shown")
        check(st["prompt-tokens"] == str(usage1["prompt_tokens"]) and st["completion-tokens"] == str(usage1["completion_tokens"]),
              f"turn 1: token counts {st['prompt-tokens']}+{st['completion-tokens']} as the API's "
              f"{usage1['prompt_tokens']}+{usage1['completion_tokens']}")

        # Turn 2 sends the conversation: the same answer and prompt size as the API's for three messages.
        a2 = p.ask(q2)
        shown2 = p.text(a2)
        history = [{"role": "user", "content": q1}, {"role": "assistant", "content": shown1}, {"role": "user", "content": q2}]
        ref2, usage2, _ = api_answer(s, history, n)
        _, st2 = p.stats(a2)
        # (The prompt's size tells the history was sent even where a random model's answer would not.)
        check(shown2 == ref2 and st2["prompt-tokens"] == str(usage2["prompt_tokens"]),
              f"turn 2 sends the history: answer and {st2['prompt-tokens']} prompt tokens as the API's ({usage2['prompt_tokens']})")
        check(p.el("api-key").get_attribute("value") == KEY and
              d.execute_script("return localStorage.getItem('tessera-api-key')") == KEY, "the key is kept in localStorage")

        # New chat: an empty conversation; the first question again gives the first answer.
        p.el("new-chat").click()
        check(len(p.answers()) == 0, "New chat clears the conversation")
        a3 = p.ask(q1)
        _, st3 = p.stats(a3)
        check(p.text(a3) == ref1 and st3["prompt-tokens"] == str(usage1["prompt_tokens"]),
              "after New chat, the first question alone again")
    finally:
        d.quit()
    check(s.stop() == 0, "tiny-model server stops cleanly")


def metric(server, name):
    m = re.search(rf"^{name} (\d+)", server.get("/metrics")[1].decode(), re.M)
    return int(m.group(1)) if m else -1


def test_default_model():
    s = start([], ["--parallel", "1"])
    d = browser()
    try:
        p = Page(d, s.port)
        p.set_field("temperature", "0")
        # A real model's answer (words, punctuation, line breaks), which a tiny random one lacks.
        q, n = "Name three colors, one per line.", 32
        p.set_field("max-tokens", str(n))
        a = p.ask(q)
        ref, _, finish = api_answer(s, [{"role": "user", "content": q}], n)
        shown = p.text(a)
        check(shown == ref and a.get_attribute("data-finish") == finish,
              f"default model: the answer shown equals the API's greedy answer ({shown!r})")
        p.el("new-chat").click()

        # Stop, while the answer streams.
        n = 400
        p.set_field("max-tokens", str(n))
        gen0 = metric(s, "tessera_generated_tokens_total")
        p.el("prompt").send_keys("Write a long story about a lighthouse keeper.")
        p.el("send").click()
        wait(d, 30).until(lambda d: p.answers() and p.text(p.answers()[0]))
        streaming = d.execute_script("return document.body.dataset.state") == "generating"
        check(streaming and not p.el("stop").get_property("disabled"),
              f"the answer is shown while it streams ({p.text(p.answers()[0])!r})")
        p.el("stop").click()
        a = p.answers()[0]
        wait(d, 10).until(lambda d: a.get_attribute("data-finish"))
        check(a.get_attribute("data-finish") == "aborted" and "stopped" in p.stats(a)[0],
              f"Stop ends the answer ({a.get_attribute('data-finish')}, {p.stats(a)[0]!r})")
        t0 = time.time()
        while metric(s, "tessera_active_slots") != 0 and time.time() - t0 < 10:
            time.sleep(0.05)
        generated = metric(s, "tessera_generated_tokens_total") - gen0
        check(metric(s, "tessera_active_slots") == 0 and 0 < generated < n,
              f"Stop cancels the sequence on the server (slot freed after {generated} of {n} tokens)")
        check(not p.el("send").get_property("disabled"), "after Stop the page takes the next question")
    finally:
        d.quit()
    check(s.stop() == 0, "default-model server stops cleanly")


def screenshot(path):
    s = start([], ["--parallel", "1"])
    d = browser(1000, 700)
    try:
        p = Page(d, s.port)
        p.set_field("temperature", "0")
        p.set_field("max-tokens", "120")
        p.ask("What is the capital of France?", timeout=120)
        p.ask("Tell me one thing to see there.", timeout=120)
        d.save_screenshot(path)
    finally:
        d.quit()
    s.stop()
    print(f"screenshot: {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    t = time.time()
    if "--screenshot" in sys.argv:
        screenshot(sys.argv[sys.argv.index("--screenshot") + 1])
        sys.exit(0)
    parts = [("tiny model", lambda: test_tiny(e2e.tiny_model()))]
    if os.environ.get("TESSERA_SERVE_E2E_TINY_ONLY"):
        print("default model (its answer, Stop): not run here (TESSERA_SERVE_E2E_TINY_ONLY: the sanitizer build)")
    else:
        parts.append(("default model", test_default_model))
    for name, part in parts:
        try:
            part()
        except Exception as e:  # a wait that timed out, a refused request: that part fails, the rest runs
            check(False, f"{name}: {type(e).__name__}: {e}")
        finally:
            for s in servers:
                if s.proc.poll() is None:
                    s.proc.kill()
    print(f"chat page e2e: {time.time() - t:.1f} s, {len(failures)} failure(s)")
    for f in failures:
        print("  FAILED:", f)
    sys.exit(1 if failures else 0)
