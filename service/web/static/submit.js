// The submit form, built from the run config's JSON schema (GET /config/schema) and the service's
// artefacts (GET /config/recipes, /models, /task-sets). Every value goes to POST /runs as an
// override; the service validates, and each 422 message is shown next to the field it names.
"use strict";

// form fields: [id, label, the run-config key it sets, where its choices come from]
const FORM_FIELDS = [
  ["recipe", "Recipe", "recipe", "recipes"],
  ["name", "Run name", "name", null],
  ["objective", "Objective", "objective", "schema"],
  ["schedule", "Schedule", "schedule", "schema"],
  ["updates", "Updates", "updates", null],
  ["model", "Model", "model.path", "models"],
  ["tasks", "Task set", "env.tasks", "task-sets"],
];
const submitForm = { schema: null, leaves: {}, recipes: [] };

// --- the schema ------------------------------------------------------------------------------------
function schemaNode(node) {
  // follow a $ref; `X | None` (anyOf with null) reads as X
  let n = node || {};
  if (n.$ref) n = Object.assign({}, submitForm.schema.$defs[n.$ref.split("/").pop()], n, { $ref: undefined });
  if (n.anyOf) {
    const some = n.anyOf.find((a) => a.type !== "null") || {};
    n = Object.assign({}, n, schemaNode(some), { anyOf: undefined, description: n.description || some.description });
  }
  return n;
}

function schemaLeaves(node, prefix = "", out = {}) {
  // every settable field as a dotted key -> its (resolved) schema
  for (const [k, v] of Object.entries(schemaNode(node).properties || {})) {
    const n = schemaNode(v);
    if (n.properties) schemaLeaves(n, prefix + k + ".", out); else out[prefix + k] = n;
  }
  return out;
}

function describe(leaf) {
  if (!leaf) return "";
  const bits = [leaf.enum ? "one of " + leaf.enum.join(", ") : leaf.type || "value"];
  if (leaf.minimum != null) bits.push("≥ " + leaf.minimum);
  if (leaf.exclusiveMinimum != null) bits.push("> " + leaf.exclusiveMinimum);
  if (leaf.default !== undefined && leaf.default !== null) bits.push("default " + JSON.stringify(leaf.default));
  return bits.join(" · ") + (leaf.description ? " — " + leaf.description : "");
}

// --- building the form -------------------------------------------------------------------------------
function options(select, items, blank) {
  select.replaceChildren(el("option", { value: "", textContent: blank }),
    ...items.map(([value, text]) => el("option", { value, textContent: text })));
}

function fieldControl(id, key, source, lists) {
  const leaf = submitForm.leaves[key];
  if (source === "recipes") {
    const s = el("select", { id: "f-" + id, required: true });
    s.replaceChildren(...submitForm.recipes.map((r) => el("option", { value: r.name, textContent: `${r.name} (${r.origin})` })));
    return s;
  }
  if (source === "schema") { const s = el("select", { id: "f-" + id }); options(s, leaf.enum.map((v) => [v, v]), "(the recipe's)"); return s; }
  if (source) {
    const s = el("select", { id: "f-" + id });
    options(s, lists[source].map((a) => [a.name, a.name + (a.shared ? " (shared)" : "")]), "(the recipe's)");
    return s;
  }
  const input = el("input", { id: "f-" + id, type: leaf.type === "integer" ? "number" : "text", placeholder: "(the recipe's)" });
  if (leaf.type === "integer") input.step = "1";
  return input;
}

function recipeHint() {
  const r = submitForm.recipes.find((x) => x.name === $("f-recipe").value);
  if (!r) return;
  const bits = [r.origin, r.objective && "objective " + r.objective, r.schedule && "schedule " + r.schedule, r.updates && r.updates + " updates"];
  $("f-recipe").parentElement.querySelector(".hint").textContent = bits.filter(Boolean).join(" · ") + (r.description ? " — " + r.description : "");
}

function addOverrideRow(key = "", value = "") {
  const n = $("override-rows").children.length;
  const keyIn = el("input", { id: "ov-key-" + n, className: "ov-key", value: key, placeholder: "e.g. optim.lr", size: 28 });
  keyIn.setAttribute("list", "override-keys");
  const valIn = el("input", { id: "ov-value-" + n, className: "ov-value", value, placeholder: "e.g. 0.01", size: 18 });
  const hint = el("p", { className: "hint" });
  const showHint = () => { hint.textContent = describe(submitForm.leaves[keyIn.value.trim()]); };
  keyIn.oninput = showHint;
  const remove = el("button", { type: "button", className: "secondary", textContent: "remove", onclick: () => row.remove() });
  const row = el("div", { className: "field override-row" },
    el("div", { className: "inline" },
      el("label", { htmlFor: keyIn.id, textContent: "Field" }), keyIn,
      el("label", { htmlFor: valIn.id, textContent: "Value" }), valIn, remove),
    hint, el("p", { className: "field-error" }));
  $("override-rows").append(row);
  showHint();
}

async function renderSubmit() {
  show("submit-view");
  const [schema, recipes, models, taskSets] = await Promise.all([
    api("/config/schema"), api("/config/recipes"), api("/models?limit=1000"), api("/task-sets?limit=1000"),
  ]);
  Object.assign(submitForm, { schema, recipes: recipes.data });
  submitForm.leaves = schemaLeaves(schema);
  const lists = { models: models.data, "task-sets": taskSets.data };
  $("form-fields").replaceChildren(...FORM_FIELDS.map(([id, label, key, source]) => {
    const control = fieldControl(id, key, source, lists);
    const help = key === "recipe" ? "" : describe(submitForm.leaves[key]);
    return el("div", { className: "field", title: key },
      el("label", { htmlFor: control.id, textContent: label }), control,
      el("p", { className: "hint", textContent: help }), el("p", { className: "field-error", id: "err-" + id }));
  }));
  $("f-recipe").value = recipes.data.some((r) => r.name === "grpo-toy") ? "grpo-toy" : recipes.data[0]?.name || "";
  $("f-recipe").onchange = recipeHint;
  recipeHint();
  const formKeys = new Set(FORM_FIELDS.map((f) => f[2]));
  $("override-keys").replaceChildren(...Object.keys(submitForm.leaves).filter((k) => !formKeys.has(k))
    .map((k) => el("option", { value: k })));
  $("override-rows").replaceChildren();
  addOverrideRow();
  $("new-run-error").textContent = "";
}

// --- submitting ------------------------------------------------------------------------------------
function parseValue(text) {
  // as `--set key=value`: JSON when it parses, else the plain text
  try { return JSON.parse(text); } catch { return text; }
}

function errorSlot(key) {
  // the error line of the field that sets `key`: a form field, else the override row naming it
  const field = FORM_FIELDS.find((f) => f[2] === key || f[0] === key);
  if (field) return $("err-" + field[0]);
  const row = [...document.querySelectorAll(".override-row")].find((r) => r.querySelector(".ov-key").value.trim() === key);
  return row ? row.querySelector(".field-error") : null;
}

function fieldErrors(detail) {
  // a 422 detail -> [dotted key | null, message]; a config error names its fields in the text
  const out = [];
  for (const d of detail) {
    const loc = (d.loc || []).filter((x) => x !== "body");
    const msg = String(d.msg || "").replace(/^Value error, /, "");
    if (loc.length > 1 && (loc[0] === "config" || loc[0] === "overrides")) { out.push([loc.slice(1).join("."), msg]); continue; }
    if (loc.length === 1 && !["config", "overrides"].includes(loc[0])) { out.push([loc[0], msg]); continue; }
    for (const part of msg.split(/; (?=[\w.[\]-]+: )/)) {
      const m = part.match(/^(?:overrides\.|config\.)?([\w.[\]-]+): /);
      out.push([m ? m[1] : null, part]);
    }
  }
  return out;
}

function showErrors(detail) {
  const general = [];
  for (const [key, msg] of fieldErrors(detail)) {
    const slot = key && errorSlot(key);
    if (!slot) { general.push(msg); continue; }
    slot.textContent = slot.textContent ? slot.textContent + "; " + msg : msg;
    slot.parentElement.classList.add("invalid");
  }
  $("new-run-error").textContent = general.join("\n");
}

$("new-run-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  for (const e of document.querySelectorAll("#submit-view .field-error")) { e.textContent = ""; e.parentElement.classList.remove("invalid"); }
  $("new-run-error").textContent = "";
  const body = { recipe: $("f-recipe").value, overrides: {} };
  for (const [id, , key] of FORM_FIELDS.slice(1)) {
    const v = $("f-" + id).value.trim();
    if (!v) continue;
    if (key === "name") body.name = v; else body.overrides[key] = id === "updates" ? parseValue(v) : v;
  }
  for (const row of document.querySelectorAll(".override-row")) {
    const key = row.querySelector(".ov-key").value.trim(), value = row.querySelector(".ov-value").value.trim();
    if (key) body.overrides[key] = parseValue(value);
    else if (value) { row.querySelector(".field-error").textContent = "name the field this value sets"; return; }
  }
  try {
    const run = await api("/runs", { method: "POST", body: JSON.stringify(body) });
    location.hash = "#/runs/" + run.id;
  } catch (e) {
    if (e.status === 422 && Array.isArray(e.detail)) showErrors(e.detail);
    else $("new-run-error").textContent = String(e.message || e);
  }
});
$("add-override").onclick = () => addOverrideRow();
