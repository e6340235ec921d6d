#!/usr/bin/env node
// Calls zerolayer's public API from Node.js with nothing but the published .proto file, loaded at
// run time: one Generate and one GenerateStream with the same greedy request, then, when the model
// has a chat template, one chat Generate of the prompt as a user message; prints one JSON line
// {text, token_ids, finish_reason, usage, stream_text, stream_token_ids, chat} (chat: {text,
// token_ids, finish_reason} or null when the model has no chat template).
//
//   npm ci && node client.js "Hello" [HOST:PORT] [MAX_NEW_TOKENS]
//
// ZEROLAYER_PROTO_DIR: the protos/ directory (default: ../../protos from this file).
"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const DEFAULT_ADDRESS = "127.0.0.1:50051";
const DEFAULT_MAX_NEW_TOKENS = 16;
const DEADLINE_MS = 60_000;

function loadTextGeneration(protoDir) {
  const definition = protoLoader.loadSync("zerolayer/v1/generation.proto", {
    includeDirs: [protoDir],
    keepCase: true, // field names as in the .proto (max_new_tokens), not camelCase
    enums: String, // finish_reason as its name, e.g. "FINISH_REASON_LENGTH"
    longs: String, // uint64 fields (seed, num_parameters) without precision loss
    defaults: true, // unset fields as their zero value, as every gRPC runtime reports them
  });
  return grpc.loadPackageDefinition(definition).zerolayer.v1.TextGeneration;
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

function call(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

function generate(client, request) {
  return call(client, "Generate", request);
}

async function chat(client, prompt, maxNewTokens) {
  const info = await call(client, "GetModelInfo", {});
  if (!info.has_chat_template) return null;
  // The server renders the messages with the model's chat template (and its generation prompt).
  const response = await generate(client, {
    messages: { messages: [{ role: "user", content: prompt }] },
    max_new_tokens: maxNewTokens,
  });
  return {
    text: response.text,
    token_ids: response.token_ids,
    finish_reason: response.finish_reason,
  };
}

function generateStream(client, request) {
  return new Promise((resolve, reject) => {
    const result = { text: "", token_ids: [], finish_reason: "", usage: null };
    const call = client.GenerateStream(request, { deadline: deadline() });
    call.on("data", (message) => {
      result.text += message.text;
      result.token_ids.push(...message.token_ids);
      if (message.finish_reason !== "FINISH_REASON_UNSPECIFIED") {
        result.finish_reason = message.finish_reason;
        result.usage = message.usage;
      }
    });
    call.on("error", reject);
    call.on("end", () => resolve(result));
  });
}

async function main(argv) {
  const [prompt, address = DEFAULT_ADDRESS, maxNewTokens = String(DEFAULT_MAX_NEW_TOKENS)] = argv;
  if (!prompt || !/^\d+$/.test(maxNewTokens)) {
    console.error("usage: node client.js PROMPT [HOST:PORT] [MAX_NEW_TOKENS]");
    return 2;
  }
  const protoDir =
    process.env.ZEROLAYER_PROTO_DIR || path.join(__dirname, "..", "..", "protos");
  const TextGeneration = loadTextGeneration(protoDir);
  const client = new TextGeneration(address, grpc.credentials.createInsecure());
  // temperature unset means greedy: the same request gives the same tokens every time.
  const request = { prompt, max_new_tokens: Number(maxNewTokens) };
  try {
    const unary = await generate(client, request);
    const stream = await generateStream(client, request);
    const chatResult = await chat(client, prompt, Number(maxNewTokens));
    console.log(
      JSON.stringify({
        text: unary.text,
        token_ids: unary.token_ids,
        finish_reason: unary.finish_reason,
        usage: unary.usage,
        stream_text: stream.text,
        stream_token_ids: stream.token_ids,
        chat: chatResult,
      }),
    );
    return 0;
  } catch (err) {
    console.error(`zerolayer: ${grpc.status[err.code] ?? err.code}: ${err.details ?? err.message}`);
    return 1;
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
