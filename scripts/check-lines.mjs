// The size rules no formatter holds, for src/: lines within 120 columns (Biome's formatter wraps code, not comments
// or strings), and functions within 80 lines, counted from their first line to their last, comments and blank lines
// included (Biome's own rule skips those). Prints each breach as FILE:LINE and exits 1 when there is one. (The C
// files' size and headers: test/unit/native-files.test.ts.)
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';

const MAX_COLUMNS = 120;
const MAX_FUNCTION_LINES = 80;
const breaches = [];
for (const entry of readdirSync('src', { recursive: true, withFileTypes: true })) {
  if (!entry.isFile() || !entry.name.endsWith('.ts')) continue;
  const file = join(entry.parentPath, entry.name);
  const text = readFileSync(file, 'utf8');
  text.split('\n').forEach((line, i) => {
    if (line.length > MAX_COLUMNS) breaches.push(`${file}:${i + 1}: ${line.length} columns`);
  });
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const visit = (node) => {
    const fn =
      ts.isFunctionDeclaration(node) ||
      ts.isMethodDeclaration(node) ||
      ts.isArrowFunction(node) ||
      ts.isFunctionExpression(node) ||
      ts.isConstructorDeclaration(node) ||
      ts.isGetAccessorDeclaration(node);
    if (fn && node.body) {
      const first = sf.getLineAndCharacterOfPosition(node.getStart()).line;
      const lines = sf.getLineAndCharacterOfPosition(node.end).line - first + 1;
      if (lines > MAX_FUNCTION_LINES)
        breaches.push(`${file}:${first + 1}: ${node.name?.getText() ?? '(anonymous function)'} runs ${lines} lines`);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
}
for (const b of breaches) console.error(b);
if (breaches.length > 0) {
  console.error(
    `check-lines: ${breaches.length} breach(es): src/ keeps to ${MAX_COLUMNS} columns and functions to ` +
      `${MAX_FUNCTION_LINES} lines`,
  );
  process.exit(1);
}
