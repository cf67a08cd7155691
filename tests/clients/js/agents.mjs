// Drives a trio-responses server with the JS Agents SDK (`@openai/agents`, its
// Responses model), for tests/clients/test_agents_js.py.
//
//   node agents.mjs BASE_URL MODEL SCENARIO
//
// Prints one JSON object on stdout: what the SDK returned. Exits 1, the error on
// stderr, when the SDK throws.

import OpenAI from "openai";
import { Agent, Runner, OpenAIResponsesModel, tool } from "@openai/agents";
import { z } from "zod";

const [baseURL, model, scenario] = process.argv.slice(2);

const client = new OpenAI({ baseURL, apiKey: "unused" });
const runner = new Runner({ tracingDisabled: true });

const getWeather = tool({
  name: "get_weather",
  description: "The weather in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => `sunny in ${city}`,
});

function agent(options = {}) {
  return new Agent({
    name: "assistant",
    model: new OpenAIResponsesModel(client, model),
    ...options,
  });
}

function toolOutputs(result) {
  return result.newItems
    .filter((item) => item.type === "tool_call_output_item")
    .map((item) => item.output);
}

const scenarios = {
  async run() {
    const result = await runner.run(agent(), "hello");
    return { output: result.finalOutput, responseId: result.lastResponseId };
  },
  async stream() {
    const result = await runner.run(agent(), "hello", { stream: true });
    const chunks = [];
    for await (const chunk of result.toTextStream()) chunks.push(chunk);
    await result.completed;
    return { chunks, output: result.finalOutput };
  },
  async tools() {
    const result = await runner.run(agent({ tools: [getWeather] }), 'call:get_weather {"city": "Paris"} call:get_weather {"city": "Oslo"}');
    return { output: result.finalOutput, toolOutputs: toolOutputs(result) };
  },
  async structured() {
    const City = z.object({ name: z.string(), population: z.number().int() });
    const result = await runner.run(
      agent({ outputType: City }),
      '{"name": "Paris", "population": 2100000}',
    );
    return { output: result.finalOutput };
  },
  async "multi-turn"() {
    const first = await runner.run(agent(), "first");
    const second = await runner.run(agent(), "second", { previousResponseId: first.lastResponseId });
    return { first: first.finalOutput, output: second.finalOutput, responseId: second.lastResponseId };
  },
  async "reasoning-minimal"() {
    const result = await runner.run(
      agent({ modelSettings: { reasoning: { effort: "minimal" } } }),
      "hello",
    );
    return { output: result.finalOutput, responseId: result.lastResponseId };
  },
};

process.stdout.write(JSON.stringify(await scenarios[scenario]()));
