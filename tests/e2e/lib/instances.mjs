// Several gateways at once, each in a temp dir of its own: the cluster tests' instances.
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

import { startGateway, toYaml } from './harness.mjs';

/**
 * n gateways started together: instance i runs config(dir, i), written to moongate.yaml in a
 * temp dir of its own (moongate-e2e-<name>-*), started with opts (startGateway's). Returns
 * { gws, dirs }, both in instance order.
 */
export async function startInstances(n, name, config, opts = {}) {
    const dirs = await Promise.all(Array.from({ length: n }, () => fsp.mkdtemp(path.join(os.tmpdir(), `moongate-e2e-${name}-`))));
    const gws = await Promise.all(dirs.map(async (dir, i) => {
        const p = path.join(dir, 'moongate.yaml');
        await fsp.writeFile(p, toYaml(config(dir, i)));
        return startGateway(p, opts);
    }));
    return { gws, dirs };
}

/** Stop the gateways, then remove their dirs (kept with MOONGATE_E2E_KEEP). */
export async function closeInstances(gws, dirs) {
    for (const g of gws) await g.close().catch(() => {});
    if (process.env.MOONGATE_E2E_KEEP) return;
    for (const d of dirs) await fsp.rm(d, { recursive: true, force: true }).catch(() => {});
}
