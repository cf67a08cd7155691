// Drives a trio-responses server with the Vercel AI SDK (`ai` + `@ai-sdk/openai`,
// `openai.responses(model)`), for tests/clients/test_vercel_ai.py.
//
//   node vercel_ai.mjs BASE_URL MODEL SCENARIO
//
// BASE_URL is the server's `/v1` URL. Prints one JSON object on stdout: what the
// SDK returned, and `requests`, the JSON bodies it POSTed to `/responses` (so the
// test can see which input items a multi-step tool loop sent back). Exits 1, the
// error on stderr, when the SDK throws.

import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, model, scenario] = process.argv.slice(2);

const requests = [];
const provider = createOpenAI({
  baseURL,
  apiKey: "unused",
  fetch: async (url, init) => {
    if (init?.method === "POST" && typeof init.body === "string") {
      requests.push(JSON.parse(init.body));
    }
    return fetch(url, init);
  },
});

const getWeather = tool({
  description: "The weather in a city.",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `sunny in ${city}`,
});

// gpt-oss reasons; the provider cannot tell from the model's name.
const stored = { openai: { forceReasoning: true } };
const stateless = {
  openai: { forceReasoning: true, store: false, include: ["reasoning.encrypted_content"] },
};

function summarizeSteps(steps) {
  return steps.map((step) => ({
    finishReason: step.finishReason,
    text: step.text,
    reasoningText: step.reasoningText ?? null,
    toolCalls: step.toolCalls.map((call) => ({ toolName: call.toolName, input: call.input })),
    toolResults: step.toolResults.map((result) => ({
      toolName: result.toolName,
      output: result.output,
    })),
    responseId: step.response.id,
  }));
}

async function toolLoop(providerOptions, streaming) {
  const options = {
    model: provider.responses(model),
    prompt: 'call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}',
    tools: { get_weather: getWeather },
    stopWhen: stepCountIs(4),
    providerOptions,
  };
  if (!streaming) {
    const result = await generateText(options);
    return { text: result.text, steps: summarizeSteps(result.steps) };
  }
  const { result, chunks } = await streamed(options);
  return { text: await result.text, chunks, steps: summarizeSteps(await result.steps) };
}

// streamText reports a failed request to onError and ends the stream: rethrow it.
async function streamed(options) {
  const errors = [];
  const result = streamText({ ...options, onError: ({ error }) => errors.push(error) });
  const chunks = [];
  for await (const chunk of result.textStream) chunks.push(chunk);
  if (errors.length > 0) throw errors[0];
  return { result, chunks };
}

const scenarios = {
  async generate() {
    const result = await generateText({
      model: provider.responses(model),
      prompt: "hello",
      providerOptions: stored,
    });
    return {
      text: result.text,
      reasoningText: result.reasoningText ?? null,
      finishReason: result.finishReason,
      usage: result.usage,
      responseId: result.response.id,
      modelId: result.response.modelId,
    };
  },
  async stream() {
    const { result, chunks } = await streamed({
      model: provider.responses(model),
      system: "Be brief.",
      prompt: "hello stream",
      providerOptions: stored,
    });
    return {
      chunks,
      text: await result.text,
      finishReason: await result.finishReason,
      usage: await result.usage,
    };
  },
  "tools-stored": () => toolLoop(stored, false),
  "tools-stored-stream": () => toolLoop(stored, true),
  "tools-stateless": () => toolLoop(stateless, false),
};

const run = scenarios[scenario];
if (run === undefined) {
  console.error(`unknown scenario ${scenario}; one of: ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
try {
  const result = await run();
  process.stdout.write(JSON.stringify({ ...result, requests }) + "\n");
} catch (error) {
  console.error(error?.stack ?? String(error));
  if (error?.responseBody) console.error(`response body: ${error.responseBody}`);
  process.stdout.write(JSON.stringify({ error: String(error?.message ?? error), requests }) + "\n");
  process.exit(1);
}
