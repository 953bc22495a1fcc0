// Domain names as DHCP and resolvers carry them (pure). One rule, used when a request is decoded and again
// when a DHCP lease is built.

const LABEL = /^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?$/;

/** Problems with one domain name (RFC 1035 section 2.3.4: labels 1..63 bytes, the encoded name at most 255). */
export function domainNameProblems(name: string, what: string): string[] {
  const n = name.endsWith('.') ? name.slice(0, -1) : name;
  if (n === '') return [`${what} ${JSON.stringify(name)} is empty`];
  const problems: string[] = [];
  for (const label of n.split('.')) {
    if (label.length > 63)
      problems.push(
        `${what} ${JSON.stringify(name)}: label ${JSON.stringify(label)} is ${label.length} bytes, at most 63`,
      );
    else if (!LABEL.test(label)) problems.push(`${what} ${JSON.stringify(name)}: bad label ${JSON.stringify(label)}`);
  }
  const encoded = n.length + 2; // length byte per label (dots become length bytes) + first length + final zero
  if (encoded > 255) problems.push(`${what} ${JSON.stringify(name)} is ${encoded} bytes encoded, at most 255`);
  return problems;
}
