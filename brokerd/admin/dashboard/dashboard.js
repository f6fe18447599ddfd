// brokerd's dashboard: reads /api/events (server-sent events) with the admin token and
// draws what it says. No framework, no CDN: this file and index.html are all there is.
"use strict";

const WINDOW = 3600;           // seconds of message rate the chart keeps: the hour the broker keeps
const rates = [];              // [{t, accepted, delivered}] per second
let previous = null;
let updates = 0;

function token() {
  const match = /(?:^|[#&])token=([^&]*)/.exec(location.hash);
  if (match) sessionStorage.setItem("brokerd-token", decodeURIComponent(match[1]));
  return sessionStorage.getItem("brokerd-token");
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  row.appendChild(td);
}

function fill(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map((values) => {
    const tr = document.createElement("tr");
    values.forEach((value) => cell(tr, value));
    return tr;
  }));
}

function sum(values) {
  return Object.values(values || {}).reduce((a, b) => a + b, 0);
}

function show(view) {
  updates += 1;
  document.body.dataset.updates = String(updates);
  document.getElementById("version").textContent = view.version;
  document.getElementById("status").textContent =
    `up ${Math.round(view.uptime_seconds)} s · ${view.topics} topics · ${view.subscriptions} subscriptions`;
  const protocols = new Set([...Object.keys(view.connections.by_protocol), ...Object.keys(view.sessions),
                             ...Object.keys(view.logins), ...Object.keys(view.auth_failures)]);
  fill("connections", [...protocols].sort().map((p) => [p, view.connections.by_protocol[p] || 0,
    view.sessions[p] || 0, view.logins[p] || 0, view.auth_failures[p] || 0]));
  fill("topics", view.top_topics.map((t) => [t.name, t.subscribers,
    Object.entries(t.by_protocol).map(([p, n]) => `${p} ${n}`).join(", ")]));
  fill("consumers", view.slowest_consumers.map((s) => [`${s.protocol} ${s.name}`, s.dropped, s.queued_bytes]));
  const queues = view.smqp_queues;
  fill("smqp", queues ? [["pending", queues.pending], ["unacknowledged", queues.unacknowledged],
    ...Object.entries(queues.trash).map(([q, n]) => [q, n])] : [["no SMQP store", ""]]);
  fill("auth-failures", view.recent_auth_failures.slice().reverse().map((f) => [
    new Date(f.time * 1000).toLocaleTimeString(), f.protocol, f.identity, f.source, f.reason]));
  const accepted = view.messages.accepted, delivered = view.messages.delivered;
  document.getElementById("accepted").textContent = accepted;
  document.getElementById("delivered").textContent = delivered;
  document.getElementById("dropped").textContent = sum(view.dropped);
  const now = view.uptime_seconds;
  if (previous !== null && now > previous.t) {
    const seconds = now - previous.t;
    rates.push({t: now, accepted: (accepted - previous.accepted) / seconds,
                delivered: (delivered - previous.delivered) / seconds});
    while (rates.length && rates[0].t < now - WINDOW) rates.shift();
  }
  previous = {t: now, accepted, delivered};
  const last = rates.length ? rates[rates.length - 1] : {accepted: 0};
  document.getElementById("rate").textContent = Math.round(last.accepted);
  draw();
}

const LINES = [["delivered", "#3b82f6"], ["accepted", "#16a34a"]];  // colours as in the legend
const Y_LABEL = "messages per second";
const X_LABEL = "seconds ago";

function niceTop(value) {
  // the axis's top: 1, 2 or 5 times a power of ten, at least the highest point (and 1)
  const power = Math.pow(10, Math.floor(Math.log10(Math.max(value, 1))));
  return [1, 2, 5, 10].map((m) => m * power).find((n) => n >= value);
}

function draw() {
  const canvas = document.getElementById("rate-chart");
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  const left = 56, right = 8, top = 8, bottom = 34;  // the plot area leaves room for the axes
  const plotW = w - left - right, plotH = h - top - bottom;
  g.clearRect(0, 0, w, h);
  const highest = Math.max(0, ...rates.map((r) => Math.max(r.accepted, r.delivered)));
  const max = niceTop(highest);
  canvas.dataset.points = String(rates.length);
  canvas.dataset.max = String(Math.max(1, highest));
  canvas.dataset.yLabel = Y_LABEL;
  canvas.dataset.xLabel = X_LABEL;
  canvas.dataset.axisTop = String(max);
  g.fillStyle = "#667";
  g.strokeStyle = "#c9ced6";
  g.lineWidth = 1;
  g.font = "11px sans-serif";
  // vertical axis: 0, half and top, with grid lines
  g.textAlign = "right";
  g.textBaseline = "middle";
  [0, max / 2, max].forEach((v) => {
    const yv = top + plotH - (v / max) * plotH;
    g.fillText(Number.isInteger(v) ? String(v) : v.toFixed(1), left - 6, yv);
    g.beginPath(); g.moveTo(left, yv); g.lineTo(w - right, yv); g.stroke();
  });
  g.save();
  g.translate(12, top + plotH / 2);
  g.rotate(-Math.PI / 2);
  g.textAlign = "center";
  g.fillText(Y_LABEL, 0, 0);
  g.restore();
  // horizontal axis: the newest reading at the right edge, the window's start at the left
  const span = WINDOW;
  g.textAlign = "center";
  g.textBaseline = "top";
  [span, span * 3 / 4, span / 2, span / 4, 0].forEach((ago) => {
    const xv = left + plotW - (ago / span) * plotW;
    g.fillText(String(ago), xv, top + plotH + 4);
  });
  g.fillText(X_LABEL, left + plotW / 2, top + plotH + 18);
  const newest = rates.length ? rates[rates.length - 1].t : 0;
  const x = (r) => left + plotW - ((newest - r.t) / span) * plotW;
  const y = (v) => top + plotH - (v / max) * plotH;
  LINES.forEach(([key, color]) => {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    rates.forEach((r, i) => (i ? g.lineTo(x(r), y(r[key])) : g.moveTo(x(r), y(r[key]))));
    g.stroke();
  });
}

async function history(headers) {
  // the broker's last hour of per-second rates (GET /api/history), drawn before the live ones
  const response = await fetch("api/history", {headers, cache: "no-store"});
  if (!response.ok) return;
  const kept = await response.json();
  rates.length = 0;
  kept.samples.forEach((s) => rates.push({t: s.t, accepted: s.accepted, delivered: s.delivered}));
  draw();
}

async function watch() {
  const secret = token();
  const headers = secret ? {Authorization: `Bearer ${secret}`} : {};
  await history(headers);
  const response = await fetch("api/events", {headers, cache: "no-store"});
  if (response.status === 401) {
    document.getElementById("status").textContent = "the admin token is needed";
    document.getElementById("token-form").hidden = false;
    return;
  }
  if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
  document.getElementById("token-form").hidden = true;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) throw new Error("the broker ended the stream");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) show(JSON.parse(data));
    }
  }
}

function start() {
  watch().catch((error) => {
    document.getElementById("status").textContent = `disconnected (${error.message}); retrying`;
    setTimeout(start, 2000);
  });
}

document.getElementById("window").textContent = `${WINDOW / 60} minutes`;
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("brokerd-token", document.getElementById("token").value);
  start();
});
start();
