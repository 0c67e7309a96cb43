// Assent web UI: answers through the HTTP API, follows the event stream, and
// adds keyboard shortcuts. Plain JavaScript, no build step.
"use strict";

(function () {
  const body = document.body;
  const auth = body.dataset.auth === "true";
  const csrf = body.dataset.csrf || "";
  const page = body.dataset.page || "";
  const live = document.getElementById("live");

  // Theme: the system's unless the user picked one here.
  const root = document.documentElement;
  const savedTheme = localStorage.getItem("assent-theme");
  if (savedTheme) root.dataset.theme = savedTheme;
  const themeButton = document.getElementById("theme");
  if (themeButton) {
    themeButton.addEventListener("click", () => {
      const dark = root.dataset.theme ? root.dataset.theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
      root.dataset.theme = dark ? "light" : "dark";
      localStorage.setItem("assent-theme", root.dataset.theme);
    });
  }

  // Without sign-in, the user says who they are; the name is kept.
  const asInput = document.getElementById("as");
  if (asInput) {
    asInput.value = localStorage.getItem("assent-as") || "";
    asInput.addEventListener("change", () => {
      asInput.value = asInput.value.trim();
      if (asInput.checkValidity()) localStorage.setItem("assent-as", asInput.value);
      else say(badName(asInput.value), true);
    });
  }

  // badName says why the broker would refuse a name, by the rule the input
  // carries (the broker's own: 1 to 128 of A-Z a-z 0-9 _ -).
  function badName(name) {
    const odd = Array.from(new Set(Array.from(name).filter((ch) => !/[A-Za-z0-9_-]/.test(ch))));
    const shown = odd.map((ch) => ch === " " ? "a space" : "“" + ch + "”").join(", ");
    return "“" + name + "” cannot answer" + (shown ? " (it has " + shown + ")" : "") + ": a name is " + asInput.dataset.rule + ", as in the policy.";
  }

  let toastTimer;
  function say(msg, bad) {
    live.textContent = msg;
    live.classList.toggle("bad", !!bad);
    place();
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { live.textContent = ""; }, bad ? 9000 : 5000);
  }

  // place puts the notice where it covers nothing the user is working on
  // (an open form, the field with focus, a note of unsent text): at the
  // bottom, else at the top, else only for screen readers; the count and
  // the cards say the same.
  function place() {
    live.classList.remove("top", "quiet");
    if (!live.textContent) return;
    const busy = Array.from(document.querySelectorAll("form.panel:not([hidden]), .comment-field:not([hidden]), .unsent, dialog[open]"));
    const a = document.activeElement;
    if (a && a !== body && a.matches("input, textarea, select, button")) busy.push(a);
    const covers = () => {
      const r = live.getBoundingClientRect();
      return busy.some((el) => {
        const b = el.getBoundingClientRect();
        return b.width > 0 && r.left < b.right && r.right > b.left && r.top < b.bottom && r.bottom > b.top;
      });
    };
    if (!covers()) return;
    live.classList.add("top");
    if (!covers()) return;
    live.classList.remove("top");
    live.classList.add("quiet");
  }
  let placing = false;
  const replace = () => {
    if (placing || !live.textContent) return;
    placing = true;
    requestAnimationFrame(() => { placing = false; place(); });
  };
  addEventListener("scroll", replace, { passive: true });
  addEventListener("resize", replace);
  document.addEventListener("focusin", replace);
  document.addEventListener("toggle", replace, true);

  class APIError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }

  async function api(method, path, data) {
    const headers = { "Accept": "application/json" };
    if (csrf) headers["X-CSRF-Token"] = csrf;
    const init = { method, headers, credentials: "same-origin" };
    if (data !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(data);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new APIError(0, "network", "The broker cannot be reached. Check your connection and try again.");
    }
    const text = await res.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch (e) { /* not JSON */ }
    if (!res.ok) {
      if (res.status === 401) {
        location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
      }
      const err = json && json.error ? json.error : { code: "http_" + res.status, message: text || res.statusText };
      throw new APIError(res.status, err.code, err.message);
    }
    return json;
  }

  // who returns the principal to send, or null after asking for one.
  function who() {
    if (auth) return undefined;
    const name = asInput ? asInput.value.trim() : "";
    if (!name) {
      say("Type your name in “Answering as” first: the broker records who answered.", true);
      if (asInput) asInput.focus();
      return null;
    }
    if (!asInput.checkValidity()) {
      say(badName(name), true);
      asInput.focus();
      return null;
    }
    localStorage.setItem("assent-as", name);
    return name;
  }

  // ---- cards --------------------------------------------------------------

  const cardsBox = document.getElementById("cards");

  function cardOf(el) { return el.closest("article.card"); }
  function cardByID(id) { return document.getElementById("r-" + id); }

  function parseCard(html) {
    const t = document.createElement("template");
    t.innerHTML = html.trim();
    return Array.from(t.content.querySelectorAll("article.card"));
  }

  async function fetchCard(id) {
    const detail = page === "" && cardsBox && cardsBox.classList.contains("single") ? "?detail=1" : "";
    const res = await fetch("/ui/cards/" + encodeURIComponent(id) + detail, { credentials: "same-origin" });
    if (!res.ok) return null;
    return parseCard(await res.text())[0] || null;
  }

  // typed lists what the user has typed on a card and not sent: the deny
  // reason, the comment, edited arguments.
  const typedFields = [
    [".deny-panel .reason", "deny-panel", "Your reason for denying"],
    [".comment-in", "", "Your comment"],
    [".edit-panel .args-edit", "edit-panel", "Your edited arguments"],
  ];
  function typed(card) {
    const out = [];
    for (const [sel, panel, label] of typedFields) {
      const el = card.querySelector(sel);
      if (!el || !el.value.trim() || el.value === el.defaultValue) continue;
      const form = panel ? el.closest("form.panel") : null;
      out.push({ sel, label, value: el.value, open: form ? !form.hidden : true });
    }
    return out;
  }

  // sending holds the ids of requests whose answer from this page is on its
  // way, answered those it answered: the event stream may show them
  // decided before the answer returns, or as it does.
  const sending = new Set(), answered = new Set();

  // keepTyped puts what was typed on the old version of a card on its new
  // one: into the same fields while it is still open; once it is decided,
  // in a note that says it was not sent, and by whom it was decided (not
  // while this page's own answer is on its way: it may be what decided).
  function keepTyped(fresh, kept) {
    if (!kept.length) return;
    if (fresh.dataset.state === "pending") {
      for (const k of kept) {
        const el = fresh.querySelector(k.sel);
        if (!el) continue;
        el.value = k.value;
        const form = el.closest("form.panel");
        if (form && k.open) form.hidden = false;
        if (form && form.classList.contains("edit-panel")) checkEdit(form);
        if (k.sel === ".comment-in") {
          el.closest(".comment-field").hidden = false;
          const b = fresh.querySelector('[data-act="comment"]');
          b.setAttribute("aria-expanded", "true");
          b.textContent = "Remove the comment";
        }
      }
      return;
    }
    if (sending.has(fresh.dataset.id) || answered.has(fresh.dataset.id)) return;
    const out = fresh.querySelector(".outcome");
    const by = out && out.dataset.by ? out.dataset.by : "";
    const word = fresh.dataset.state === "expired" ? "expired" : "was " + fresh.dataset.state;
    const note = document.createElement("div");
    note.className = "unsent";
    note.setAttribute("role", "alert");
    const p = document.createElement("p");
    const strong = document.createElement("strong");
    strong.textContent = "Not sent: ";
    p.append(strong, "this request " + word + (by === "policy" ? " by the policy" : by ? " by " + by : "") +
      " before you answered, so what you typed below did not reach the agent. Copy it if you need it.");
    note.appendChild(p);
    for (const k of kept) {
      const label = document.createElement("label");
      label.textContent = k.label;
      const ta = document.createElement("textarea");
      ta.readOnly = true;
      ta.className = "mono";
      ta.rows = Math.min(6, k.value.split("\n").length + 1);
      ta.value = k.value;
      label.appendChild(ta);
      note.appendChild(label);
    }
    const dismiss = document.createElement("button");
    dismiss.type = "button";
    dismiss.className = "btn quiet small";
    dismiss.dataset.act = "dismiss";
    dismiss.textContent = "Dismiss";
    note.appendChild(dismiss);
    fresh.appendChild(note);
    fresh.classList.add("kept");
  }

  // refresh replaces a card with its current version, keeping what the user
  // typed on it unless sent says it was just sent. Refreshes of one card run
  // one after another: two at once would both replace the same old card, and
  // the one fetched first (perhaps still pending) could be the one left on
  // the page.
  const refreshing = new Map();
  function refresh(id, sent) {
    const prev = refreshing.get(id) || Promise.resolve();
    const next = prev.then(() => replaceCard(id, sent), () => replaceCard(id, sent));
    refreshing.set(id, next);
    const done = () => { if (refreshing.get(id) === next) refreshing.delete(id); };
    next.then(done, done);
    return next;
  }

  async function replaceCard(id, sent) {
    const old = cardByID(id);
    if (!old) return null;
    const fresh = await fetchCard(id);
    if (!fresh) return null;
    const kept = sent ? [] : typed(old);
    const selected = old.classList.contains("selected");
    const hadFocus = old.contains(document.activeElement);
    const focusSel = hadFocus ? typedFields.map((f) => f[0]).find((sel) => old.querySelector(sel) === document.activeElement) : null;
    old.querySelectorAll(".arg-more[aria-expanded=\"true\"]").forEach((b) => {
      const i = Array.from(old.querySelectorAll(".arg-more")).indexOf(b);
      const nb = fresh.querySelectorAll(".arg-more")[i];
      if (nb && nb.dataset.fold === b.dataset.fold) unfold(nb);
    });
    // The answer says when the request was first shown here, and whether
    // its detail was looked at, whatever version of the card it comes from.
    if (old.dataset.shown && fresh.dataset.state === "pending") fresh.dataset.shown = old.dataset.shown;
    if (old.dataset.looked) fresh.dataset.looked = old.dataset.looked;
    old.replaceWith(fresh);
    keepTyped(fresh, kept);
    const note = old.querySelector(".unsent"); // from an earlier refresh
    if (note && !fresh.querySelector(".unsent")) {
      fresh.appendChild(note);
      fresh.classList.add("kept");
    }
    if (selected) fresh.classList.add("selected");
    if (old.classList.contains("resolved")) fresh.classList.add("resolved");
    if (hadFocus) {
      const el = focusSel && fresh.dataset.state === "pending" ? fresh.querySelector(focusSel) : null;
      (el || fresh).focus();
    }
    tick();
    return fresh;
  }

  function updateCount(delta) {
    const c = document.getElementById("count");
    if (!c) return;
    const n = Math.max(0, parseInt(c.dataset.total || "0", 10) + delta);
    c.dataset.total = String(n);
    c.textContent = String(n);
    document.title = (n > 0 ? "Pending (" + n + ")" : "Pending") + document.title.replace(/^[^·]*/, " ");
    const empty = document.getElementById("empty");
    if (empty) empty.hidden = cardsBox.querySelector("article.card") !== null;
  }

  // resolved shows a decided card for a moment on the pending page, then
  // removes it.
  const leaving = new Set();
  function resolved(card) {
    if (!card || page !== "pending" || card.dataset.state === "pending") return;
    card.classList.add("resolved");
    syncSessions();
    const id = card.dataset.id;
    if (leaving.has(id)) return;
    leaving.add(id);
    updateCount(-1);
    setTimeout(() => {
      const now = cardByID(id);
      if (now && now.classList.contains("kept")) return; // until dismissed: it holds what the user typed
      if (now) now.classList.add("gone");
      setTimeout(() => {
        const c = cardByID(id);
        if (c) {
          if (c.classList.contains("selected")) select(1);
          c.remove();
        }
        leaving.delete(id);
        updateCount(0);
      }, 450);
    }, 8000);
  }

  function describeOutcome(card) {
    const out = card.querySelector(".outcome .summary") || card.querySelector(".outcome");
    return out ? out.textContent.replace(/\s+/g, " ").trim() : "";
  }

  // answer sends data as the answer to card's request; form, if given, is
  // the form it came from, which shows why the broker refused it (edited
  // arguments that break the request's input_schema, a payload that breaks
  // its response_schema) and stays open with what was written.
  async function answer(card, data, form) {
    const p = who();
    if (p === null) return;
    if (p !== undefined) data.principal = p;
    data.channel = "web";
    // When this page showed the request, and whether the answer comes from
    // its own page or after unfolding its detail (docs/web.md).
    if (card.dataset.shown) data.shown_at = card.dataset.shown;
    if (card.dataset.detail === "true" || card.dataset.looked === "true") data.detail = true;
    const comment = card.querySelector(".comment-in");
    if (data.decision === "approve" && comment && comment.value.trim()) data.reason = comment.value.trim();
    const rem = card.querySelector(".remember");
    if (rem && rem.querySelector(".rem-on").checked) {
      data.remember = { scope: rem.querySelector(".rem-scope").value, ttl: rem.querySelector(".rem-ttl").value };
    }
    const err = card.querySelector(".card-error");
    const buttons = card.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    const id = card.dataset.id;
    const mine = typed(card);
    sending.add(id);
    try {
      await api("POST", "/v1/approvals/" + encodeURIComponent(id) + "/decision", data);
      answered.add(id);
      sending.delete(id);
      const fresh = await refresh(id, true);
      if (fresh) {
        say(fresh.querySelector(".tool").textContent + ": " + describeOutcome(fresh));
        resolved(fresh);
      }
    } catch (e) {
      sending.delete(id);
      buttons.forEach((b) => { b.disabled = false; });
      if (e.code === "already_decided" || e.code === "expired") {
        // Someone else was first: what this answer carried was not sent.
        const fresh = await refresh(id, true);
        if (fresh && !fresh.querySelector(".unsent")) keepTyped(fresh, mine);
        say("Already decided: " + (fresh ? describeOutcome(fresh) : e.message), true);
        resolved(fresh);
        return;
      }
      const inForm = form && !form.hidden && e.code === "invalid_request" ? form.querySelector(".error") : null;
      if (inForm) {
        // Next to what was written, which stays as it was: the approver
        // fixes it and sends again.
        inForm.textContent = "Not accepted: " + e.message.replace(/^invalid input: /, "");
        inForm.hidden = false;
        const box = form.querySelector("textarea, input, select");
        if (box) { box.setAttribute("aria-invalid", "true"); box.focus(); }
        if (err) err.hidden = true;
        return; // the form's error is an alert already
      }
      if (err) { err.textContent = e.message; err.hidden = false; }
      say(e.message, true);
    }
  }

  function openPanel(card, cls) {
    card.querySelectorAll("form.panel").forEach((f) => { f.hidden = !f.classList.contains(cls); });
    const panel = card.querySelector("form." + cls);
    if (!panel) return null;
    // A comment written for an approval becomes the start of a denial's
    // reason, rather than being dropped.
    const comment = card.querySelector(".comment-in");
    const reason = panel.querySelector(".reason");
    if (reason && !reason.value && comment && comment.value.trim()) reason.value = comment.value.trim();
    const first = panel.querySelector("textarea, input, select");
    if (first) first.focus();
    return panel;
  }

  function closePanels(card) {
    card.querySelectorAll("form.panel").forEach((f) => { f.hidden = true; });
  }

  // ---- edited arguments: check as JSON, show the difference ----------------

  function pretty(text) { return JSON.stringify(JSON.parse(text), null, 2); }

  // diffLines is a line diff (longest common subsequence).
  function diffLines(a, b) {
    const n = a.length, m = b.length;
    const dp = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        dp[i][j] = a[i] === b[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
      }
    }
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push(["same", a[i]]); i++; j++; }
      else if (dp[i + 1][j] >= dp[i][j + 1]) { out.push(["del", a[i++]]); }
      else { out.push(["add", b[j++]]); }
    }
    while (i < n) out.push(["del", a[i++]]);
    while (j < m) out.push(["add", b[j++]]);
    return out;
  }

  // fold shortens an unchanged line of the difference, so that a long value
  // does not push the changes out of sight.
  function fold(line) {
    const chars = Array.from(line);
    if (chars.length <= 120) return line;
    return chars.slice(0, 100).join("") + "… (" + (chars.length - 100).toLocaleString("en-US") + " more characters, unchanged)";
  }

  function checkEdit(panel) {
    const ta = panel.querySelector("textarea");
    const err = panel.querySelector(".error");
    const diff = panel.querySelector(".diff");
    let now;
    try {
      now = pretty(ta.value);
      if (JSON.parse(ta.value) === null || typeof JSON.parse(ta.value) !== "object" || Array.isArray(JSON.parse(ta.value))) {
        throw new Error("arguments are a JSON object: { … }");
      }
    } catch (e) {
      err.textContent = "Not valid: " + e.message;
      err.hidden = false;
      diff.hidden = true;
      ta.setAttribute("aria-invalid", "true");
      return null;
    }
    err.hidden = true;
    ta.removeAttribute("aria-invalid");
    const before = pretty(ta.defaultValue).split("\n");
    const lines = diffLines(before, now.split("\n"));
    diff.replaceChildren();
    let changed = false;
    for (const [kind, text] of lines) {
      if (kind !== "same") changed = true;
      const div = document.createElement("div");
      div.className = kind;
      div.textContent = kind === "same" ? fold(text) : text;
      diff.appendChild(div);
    }
    diff.hidden = !changed;
    return { args: JSON.parse(ta.value), changed };
  }

  // ---- structured answers ----------------------------------------------------

  function payloadOf(panel) {
    const err = panel.querySelector(".error");
    err.hidden = true;
    const raw = panel.querySelector("textarea.payload");
    if (raw) {
      try { return JSON.parse(raw.value); } catch (e) {
        err.textContent = "Not valid JSON: " + e.message; err.hidden = false; raw.focus(); return undefined;
      }
    }
    const out = {};
    for (const f of panel.querySelectorAll(".field")) {
      const name = f.dataset.name, type = f.dataset.type;
      const input = f.querySelector("input, select");
      if (type === "boolean") { out[name] = input.checked; continue; }
      if (input.value === "") {
        if (input.required) { err.textContent = f.querySelector("label").textContent.replace("*", "").trim() + " is required."; err.hidden = false; input.focus(); return undefined; }
        continue;
      }
      if (type === "number" || type === "integer") {
        const n = Number(input.value);
        if (!Number.isFinite(n) || (type === "integer" && !Number.isInteger(n))) {
          err.textContent = name + ": want " + (type === "integer" ? "a whole number" : "a number"); err.hidden = false; input.focus(); return undefined;
        }
        out[name] = n;
      } else {
        out[name] = input.value;
      }
    }
    return out;
  }

  // ---- clicks and submits ----------------------------------------------------

  document.addEventListener("change", (ev) => {
    if (ev.target.classList.contains("rem-on")) ev.target.closest(".remember").classList.toggle("on", ev.target.checked);
  });

  // Opening a card's arguments schema is looking at its detail too.
  document.addEventListener("toggle", (ev) => {
    const d = ev.target;
    const card = d.open && d.classList && d.classList.contains("args-schema") ? cardOf(d) : null;
    if (card) card.dataset.looked = "true";
  }, true);

  document.addEventListener("input", (ev) => {
    if (ev.target.classList.contains("args-edit")) checkEdit(ev.target.closest("form"));
  });

  // unfold shows a folded argument's whole value in place, or folds it
  // again.
  function unfold(btn) {
    const val = btn.closest(".arg-val");
    const open = btn.getAttribute("aria-expanded") !== "true";
    const card = cardOf(btn);
    if (open && card) card.dataset.looked = "true";
    val.querySelector(".arg-head").hidden = open;
    val.querySelector(".arg-full").hidden = !open;
    btn.setAttribute("aria-expanded", String(open));
    btn.textContent = open ? "Show less" : btn.dataset.fold;
  }

  document.addEventListener("click", async (ev) => {
    const btn = ev.target.closest("button");
    if (!btn) return;
    if (btn.classList.contains("arg-more")) return unfold(btn);
    const card = cardOf(btn);
    if (card) select(card);
    switch (btn.dataset.act) {
      case "approve": return answer(card, { decision: "approve" });
      case "deny": return openPanel(card, "deny-panel");
      case "edit": { const p = openPanel(card, "edit-panel"); if (p) checkEdit(p); return; }
      case "answer": return openPanel(card, "answer-panel");
      case "close": return closePanels(card);
    case "comment": {
      const field = card.querySelector(".comment-field");
      field.hidden = !field.hidden;
      btn.setAttribute("aria-expanded", String(!field.hidden));
      btn.textContent = field.hidden ? "Add a comment" : "Remove the comment";
      if (!field.hidden) field.querySelector("input").focus(); else field.querySelector("input").value = "";
      return;
    }
    case "dismiss": {
      const note = btn.closest(".unsent");
      if (note) note.remove();
      card.classList.remove("kept");
      if (page === "pending" && card.dataset.state !== "pending") {
        card.classList.add("gone");
        setTimeout(() => {
          if (card.classList.contains("selected")) select(1);
          card.remove();
          leaving.delete(card.dataset.id);
          updateCount(0);
        }, 450);
      }
      return;
    }
    }
    if (btn.dataset.batch) return batch(btn);
    if (btn.dataset.revoke) return revoke(btn);
    if (btn.id === "keys") return help();
  });

  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    const card = cardOf(form);
    if (!card || !form.classList.contains("panel")) return;
    ev.preventDefault();
    if (form.classList.contains("deny-panel")) {
      answer(card, { decision: "deny", reason: form.querySelector(".reason").value.trim() });
    } else if (form.classList.contains("edit-panel")) {
      const r = checkEdit(form);
      if (!r) return;
      answer(card, r.changed ? { decision: "approve", args: r.args } : { decision: "approve" }, form);
    } else if (form.classList.contains("answer-panel")) {
      const payload = payloadOf(form);
      if (payload !== undefined) answer(card, { decision: "approve", payload }, form);
    }
  });

  async function batch(btn) {
    const session = btn.dataset.session;
    const verb = btn.dataset.batch;
    const n = cardsBox.querySelectorAll('article.card[data-state="pending"][data-session="' + CSS.escape(session) + '"]').length;
    const data = { session, decision: verb, channel: "web" };
    if (verb === "deny") {
      const reason = prompt("Deny every pending request of session " + session + "? The agent sees this reason:", "");
      if (reason === null) return;
      data.reason = reason.trim();
    } else if (!confirm("Approve every pending request of session " + session + " (" + n + " on this page, and any others)?")) {
      return;
    }
    const p = who();
    if (p === null) return;
    if (p !== undefined) data.principal = p;
    btn.disabled = true;
    try {
      const res = await api("POST", "/v1/decisions", data);
      const counts = {};
      for (const r of res.results || []) {
        counts[r.status] = (counts[r.status] || 0) + 1;
        const fresh = await refresh(r.id);
        resolved(fresh);
      }
      const parts = Object.entries(counts).map(([k, v]) => v + " " + k.replace(/_/g, " "));
      say("Session " + session + ": " + (parts.join(", ") || "nothing was pending"));
    } catch (e) {
      say(e.message, true);
    } finally {
      btn.disabled = false;
    }
  }

  async function revoke(btn) {
    const row = btn.closest("tr");
    if (!confirm("Revoke this remembered choice? Matching requests will be asked again.")) return;
    btn.disabled = true;
    try {
      await api("DELETE", "/v1/remembered/" + encodeURIComponent(btn.dataset.revoke));
      row.remove();
      say("Revoked.");
    } catch (e) {
      btn.disabled = false;
      say(e.message, true);
    }
  }

  // ---- keyboard ----------------------------------------------------------------

  function cards() { return cardsBox ? Array.from(cardsBox.querySelectorAll("article.card:not(.gone)")) : []; }

  function select(target) {
    const list = cards();
    if (!list.length) return null;
    let card = target;
    if (typeof target === "number") {
      // j and k move among the cards still open; a decided card stays on
      // the page a moment to be read, but there is nothing left to do on it.
      const open = (c) => !c.classList.contains("resolved");
      const cur = list.findIndex((c) => c.classList.contains("selected"));
      let i = cur;
      if (cur < 0) {
        i = Math.max(0, list.findIndex(open));
      } else {
        for (let j = cur + target; j >= 0 && j < list.length; j += target) {
          if (open(list[j])) { i = j; break; }
        }
      }
      card = list[i];
    }
    list.forEach((c) => c.classList.toggle("selected", c === card));
    if (typeof target === "number") {
      card.focus({ preventScroll: true });
      card.scrollIntoView({ block: "nearest", behavior: matchMedia("(prefers-reduced-motion: reduce)").matches ? "auto" : "smooth" });
    }
    return card;
  }

  function help() {
    const d = document.getElementById("help");
    if (d && !d.open) d.showModal();
  }

  let pendingG = false;
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target;
    const typing = t.matches("input, textarea, select, [contenteditable]");
    if (ev.key === "Escape") {
      const card = cardOf(t) || document.querySelector("article.card.selected");
      if (card) { closePanels(card); card.focus(); }
      return;
    }
    if (typing) return;
    if (pendingG) {
      pendingG = false;
      if (ev.key === "h") { location.href = "/history"; return; }
      if (ev.key === "p") { location.href = "/"; return; }
      if (ev.key === "r") { location.href = "/remembered"; return; }
    }
    const sel = document.querySelector("article.card.selected") || (cards().length === 1 ? cards()[0] : null);
    switch (ev.key) {
      case "j": select(1); break;
      case "k": select(-1); break;
      case "g": pendingG = true; return;
      case "?": help(); break;
      case "a": if (sel && sel.querySelector('[data-act="approve"]')) answer(sel, { decision: "approve" }); else return; break;
      case "d": if (sel && openPanel(sel, "deny-panel")) break; return;
      case "e": { const p = sel && openPanel(sel, "edit-panel"); if (p) { checkEdit(p); break; } return; }
      case "o": case "Enter": if (sel && t === sel) location.href = "/approvals/" + sel.dataset.id; else return; break;
      default: return;
    }
    ev.preventDefault();
  });

  // ---- time ----------------------------------------------------------------------

  function brief(ms) {
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 172800) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d";
  }

  // tick keeps relative times true: "in 9m 58s", "2s ago".
  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll("time.deadline, time.until")) {
      const left = Date.parse(el.getAttribute("datetime")) - now;
      el.textContent = left > 0 ? "in " + brief(left) : "now";
      el.classList.toggle("soon", left > 0 && left < 60000);
    }
    for (const el of document.querySelectorAll("time.ago")) {
      el.textContent = brief(Math.max(0, now - Date.parse(el.getAttribute("datetime")))) + " ago";
    }
  }
  setInterval(tick, 1000);
  tick();

  // ---- live ------------------------------------------------------------------------

  // syncSessions keeps a bar for every session with several requests waiting
  // on the page (or the one the page is filtered by), to answer them at once.
  function syncSessions() {
    if (page !== "pending" || !cardsBox) return;
    const counts = new Map();
    for (const c of cardsBox.querySelectorAll('article.card[data-state="pending"]:not(.resolved)')) {
      if (c.dataset.session) counts.set(c.dataset.session, (counts.get(c.dataset.session) || 0) + 1);
    }
    const only = cardsBox.dataset.filterSession;
    let box = document.querySelector("section.sessions");
    for (const bar of document.querySelectorAll(".session[data-session]")) {
      const n = counts.get(bar.dataset.session) || 0;
      if (n < 2 && !(only && n > 0)) bar.remove();
    }
    for (const [session, n] of counts) {
      if (n < 2 && !only) continue;
      let bar = document.querySelector('.session[data-session="' + CSS.escape(session) + '"]');
      if (!bar) {
        if (!box) {
          box = document.createElement("section");
          box.className = "sessions";
          box.setAttribute("aria-label", "Answer a whole session");
          cardsBox.before(box);
        }
        bar = sessionBar(session);
        box.appendChild(bar);
      }
      bar.querySelector(".n").textContent = n === 1 ? "1 request" : n + " requests";
    }
  }

  function sessionBar(session) {
    const bar = document.createElement("div");
    bar.className = "session";
    bar.dataset.session = session;
    const label = document.createElement("span");
    const name = document.createElement("strong");
    name.textContent = session;
    const n = document.createElement("span");
    n.className = "n";
    label.append("Session ", name, ": ", n, " waiting");
    const actions = document.createElement("span");
    actions.className = "actions";
    for (const [verb, text] of [["approve", "Approve all"], ["deny", "Deny all"]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "btn small " + verb;
      b.dataset.batch = verb;
      b.dataset.session = session;
      b.textContent = text;
      actions.appendChild(b);
    }
    const only = document.createElement("a");
    only.className = "small";
    only.href = "/?session=" + encodeURIComponent(session);
    only.textContent = "Only this session";
    actions.appendChild(only);
    bar.append(label, actions);
    return bar;
  }

  function shows(ev) {
    const f = cardsBox.dataset;
    return (!f.filterAgent || ev.agent === f.filterAgent) && (!f.filterSession || ev.session === f.filterSession);
  }

  async function arrived(id) {
    if (cardByID(id) || cardsBox.dataset.more === "true" || new URLSearchParams(location.search).has("after")) return;
    const card = await fetchCard(id);
    if (!card || cardByID(id) || card.dataset.state !== "pending") return;
    card.classList.add("arrived");
    cardsBox.appendChild(card);
    updateCount(1);
    syncSessions();
    tick();
    say("New request: " + card.querySelector(".tool").textContent + (card.dataset.agent ? " from " + card.dataset.agent : ""));
  }

  // reconcile brings the page up to date after (re)connecting: requests that
  // arrived or were decided while it was not listening.
  async function reconcile() {
    if (page !== "pending") return;
    const q = new URLSearchParams();
    if (cardsBox.dataset.filterAgent) q.set("agent", cardsBox.dataset.filterAgent);
    if (cardsBox.dataset.filterSession) q.set("session", cardsBox.dataset.filterSession);
    const res = await fetch("/ui/cards?" + q, { credentials: "same-origin" });
    if (!res.ok) return;
    const now = parseCard(await res.text());
    const ids = new Set(now.map((c) => c.dataset.id));
    for (const c of cards()) {
      if (c.dataset.state === "pending" && !ids.has(c.dataset.id)) resolved(await refresh(c.dataset.id));
    }
    if (cardsBox.dataset.more !== "true") {
      for (const c of now) {
        if (!cardByID(c.dataset.id) && c.dataset.state === "pending") { cardsBox.appendChild(c); }
      }
    }
    syncSessions();
    const total = parseInt(res.headers.get("X-Total") || "0", 10);
    const count = document.getElementById("count");
    if (count) { count.dataset.total = String(total); updateCount(0); }
    tick();
  }

  function follow() {
    if (!cardsBox || !window.EventSource) return;
    const conn = document.getElementById("conn");
    const q = new URLSearchParams({ type: "pending,escalated,responded,decided" });
    const single = cardsBox.classList.contains("single") ? cardsBox.querySelector("article.card") : null;
    if (single) {
      if (single.dataset.state !== "pending") return;
      q.set("request", single.dataset.id);
    } else {
      if (cardsBox.dataset.filterAgent) q.set("agent", cardsBox.dataset.filterAgent);
      if (cardsBox.dataset.filterSession) q.set("session", cardsBox.dataset.filterSession);
    }
    const es = new EventSource("/v1/events?" + q);
    es.onopen = () => {
      if (conn) { conn.dataset.state = "live"; conn.textContent = "live"; }
      reconcile();
    };
    es.onerror = () => {
      if (conn) { conn.dataset.state = "lost"; conn.textContent = "reconnecting…"; }
    };
    const handle = async (msg) => {
      let ev;
      try { ev = JSON.parse(msg.data); } catch (e) { return; }
      const id = ev.request_id;
      if (!id) return;
      if (msg.type === "pending") {
        if (!single && shows(ev)) arrived(id);
        return;
      }
      if (!cardByID(id)) return;
      const fresh = await refresh(id);
      if (msg.type === "decided" && fresh) {
        if (!single) say(fresh.querySelector(".tool").textContent + ": " + describeOutcome(fresh));
        resolved(fresh);
        syncSessions();
        if (single) es.close();
      }
    };
    for (const t of ["pending", "escalated", "responded", "decided"]) es.addEventListener(t, handle);
  }
  follow();
})();
