// The SDK's public surface: every module re-exported (see README.md).
export {};
