/** Brokers that cannot serve: a refused port, and a listener that accepts and never answers. */
import { createServer, type Server, type Socket } from "node:net";

export interface DeadBroker {
  address: string;
  close(): Promise<void>;
}

/** A port nothing listens on (bound, then released). */
export async function refusingBroker(): Promise<DeadBroker> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return { address: `127.0.0.1:${port}`, close: async () => undefined };
}

/** Accepts connections and reads forever without a byte in reply: every request hangs. */
export async function silentBroker(): Promise<DeadBroker> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("data", () => undefined);
    socket.on("error", () => undefined);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return {
    address: `127.0.0.1:${port}`,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export interface CapturedLog {
  warnings: string[];
  logger: { warn(message: string): void; info(message: string): void; error(message: string): void };
}

export function captureLog(): CapturedLog {
  const warnings: string[] = [];
  return {
    warnings,
    logger: { warn: (m) => warnings.push(m), info: () => undefined, error: (m) => warnings.push(m) },
  };
}
