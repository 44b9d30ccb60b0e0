// The Vercel AI SDK's default multi-step tool loop against a Responses endpoint.
//
//   E2E_NODE_DIR=.cache/e2e/node node ai_sdk.mjs --base-url URL/v1 --mode stream|generate \
//       [--provider-options '{"store":false}']
//
// One tool, get_weather({city}) -> {city, tempC: 21}; stopWhen stepCountIs(3); every other
// setting is the SDK's default. Prints one JSON object: the steps, the final text, the stream
// part types seen, the SDK's warnings and every error (reported, not thrown: exit code 0).
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';

// The packages live in the cache folder, not beside this script.
const require = createRequire(`${process.env.E2E_NODE_DIR}/`);
const { generateText, streamText, stepCountIs, tool, jsonSchema } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

const { values: args } = parseArgs({
  options: {
    'base-url': { type: 'string' },
    mode: { type: 'string', default: 'stream' },
    model: { type: 'string', default: 'qwen3' },
    'provider-options': { type: 'string' },
  },
});

const report = { steps: [], partTypes: [], errors: [], warnings: [] };
// Into the report rather than onto stdout, which carries the report alone.
globalThis.AI_SDK_LOG_WARNINGS = ({ warnings }) => report.warnings.push(...warnings);
const error = (where, e) => report.errors.push({ where, name: e?.name, message: String(e?.message ?? e) });
const step = (s) => ({
  text: s.text,
  reasoningText: s.reasoningText ?? '',  // AI SDK 7 leaves it undefined without reasoning
  toolCalls: s.toolCalls.map((c) => ({ toolName: c.toolName, toolCallId: c.toolCallId, input: c.input })),
  toolResults: s.toolResults.map((r) => ({ toolName: r.toolName, toolCallId: r.toolCallId, output: r.output })),
  content: s.content.map((c) => c.type),
  finishReason: s.finishReason,
});

const openai = createOpenAI({ baseURL: args['base-url'], apiKey: 'e2e' });
const request = {
  // openai(model) is the Responses API in AI SDK >= 5.
  model: openai(args.model),
  prompt: 'What is the weather in Paris?',
  tools: {
    get_weather: tool({
      description: 'Get the weather for a city',
      inputSchema: jsonSchema({
        type: 'object',
        properties: { city: { type: 'string' } },
        required: ['city'],
        additionalProperties: false,
      }),
      execute: async ({ city }) => ({ city, tempC: 21 }),
    }),
  },
  stopWhen: stepCountIs(3),
  // Each step as it ends, so that a failed step 2 still leaves step 1 in the report.
  onStepFinish: (s) => report.steps.push(step(s)),
  providerOptions: args['provider-options'] ? { openai: JSON.parse(args['provider-options']) } : undefined,
};

try {
  let result;
  if (args.mode === 'generate') {
    result = await generateText(request);
  } else {
    result = streamText({ ...request, onError: ({ error: e }) => error('onError', e) });
    for await (const part of result.fullStream) {
      if (!report.partTypes.includes(part.type)) report.partTypes.push(part.type);
      if (part.type === 'error' || part.type === 'tool-error') error(part.type, part.error);
    }
  }
  report.text = await result.text;
  report.finishReason = await result.finishReason;
} catch (e) {
  error('throw', e);
}
console.log(JSON.stringify(report, null, 2));
