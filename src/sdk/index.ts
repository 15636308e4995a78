/**
 * The TypeScript SDK for code inside this repository. The SDK itself is the package in
 * sdk/typescript (`@collimate/sdk`, published without the server); this re-exports its sources so
 * the server's tests, benches and tools import the very code users install.
 */
export * from '../../sdk/typescript/src/index.js';
