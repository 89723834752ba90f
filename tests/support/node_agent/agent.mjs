#!/usr/bin/env node
// A calculator agent on the official `openai` npm client, run as an `exec:` agent: the dataset
// row arrives as JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY point at the sandbox's relay,
// and the last line of stdout is the reward. Both calls stream; the first offers a tool.
import OpenAI from "openai";

const TOOLS = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluate an arithmetic expression with + - * and parentheses.",
    parameters: { type: "object", properties: { expression: { type: "string", description: "e.g. 23*7" } },
                  required: ["expression"] },
  },
}];

function calculate(expression) {
  if (!/^[0-9+\-*() ]+$/.test(expression)) throw new Error(`not arithmetic: ${expression}`);
  return String(Function(`"use strict"; return (${expression});`)());
}

// One streamed completion: the text and the tool calls, assembled from their deltas.
async function streamed(client, messages, tools) {
  const stream = await client.chat.completions.create({ model: "m", messages, tools, stream: true, max_tokens: 48 });
  let text = "";
  const calls = [];
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta ?? {};
    text += delta.content ?? "";
    for (const d of delta.tool_calls ?? []) {
      const call = (calls[d.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      call.id += d.id ?? "";
      call.function.name += d.function?.name ?? "";
      call.function.arguments += d.function?.arguments ?? "";
    }
  }
  return { text, calls };
}

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const row = JSON.parse(Buffer.concat(chunks).toString());
const client = new OpenAI({ maxRetries: 0 });
const messages = [{ role: "system", content: "You are a helpful assistant. Use the calculator tool for arithmetic." },
                  { role: "user", content: row.question }];
const first = await streamed(client, messages, TOOLS);
if (first.calls.length === 0) throw new Error(`no tool call: ${JSON.stringify(first.text)}`);
messages.push({ role: "assistant", content: null, tool_calls: first.calls });
for (const call of first.calls) {
  const { expression } = JSON.parse(call.function.arguments);
  messages.push({ role: "tool", tool_call_id: call.id, content: calculate(expression) });
}
const second = await streamed(client, messages, TOOLS);
console.error(`tool calls: ${JSON.stringify(first.calls)}; answer: ${second.text}`);
console.log(second.text.includes(`\\boxed{${row.answer}}`) ? "1.0" : "0.0");
