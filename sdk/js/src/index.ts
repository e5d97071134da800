// The SDK's public surface: every module re-exported (see README.md).
export * from "./bytes.js";
export * from "./link.js";
export * from "./envelope.js";
export * from "./signalseal.js";
