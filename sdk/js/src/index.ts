// The SDK's public surface: every module re-exported (see README.md).
export * from "./bytes.js";
export * from "./link.js";
export * from "./envelope.js";
export * from "./signalseal.js";
export * from "./errors.js";
export * from "./batch.js";
export * from "./mailbox.js";
export * from "./watch.js";
export * from "./signal.js";
export * from "./ice.js";
export * from "./connect.js";
export * from "./agentframe.js";
export * from "./agent.js";
