// Elements built from text: nothing in the page ever parses user or model text as markup.

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children); // strings become text nodes
  return node;
}

export function svg(tag, attributes = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  return node;
}

export const count = (n) => Number(n ?? 0).toLocaleString("en");

// Binary units, as `reame config` writes sizes.
export function size(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(bytes), unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(unit && value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function percent(part, whole) {
  return whole > 0 ? `${Math.round((100 * part) / whole)}%` : "–";
}
