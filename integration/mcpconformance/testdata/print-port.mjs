// Preloaded (node --import) into server-everything's streamable HTTP
// server, started with PORT=0: prints the port the kernel chose, which the
// server itself only reports as 0, for the test to connect to.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  this.once("listening", () => {
    const a = this.address();
    if (a && typeof a === "object") console.error(`conformance: listening on port ${a.port}`);
  });
  return listen.apply(this, args);
};
