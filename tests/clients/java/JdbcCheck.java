import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Driven by tests/clients/test_jdbc.py: runs Orders and SnowflakeIds against
 * the server in PGHOST, PGPORT, PGDATABASE, PGUSER (over TCP) and prints what
 * happened as one JSON object; the test asserts on it.
 * Usage: java JdbcCheck single|batch|unnest|prefetched|prefetch|cost
 */
public final class JdbcCheck {
    public static void main(String[] args) throws Exception {
        Map<String, Object> out;
        switch (args.length == 1 ? args[0] : "") {
            case "single": out = single(); break;
            case "batch": case "unnest": case "prefetched": out = batch(args[0]); break;
            case "prefetch": out = prefetch(); break;
            case "cost": out = cost(); break;
            default: throw new IllegalArgumentException("usage: JdbcCheck single|batch|unnest|prefetched|prefetch|cost");
        }
        System.out.println(json(out));
    }

    static Connection connect(String params) throws SQLException {
        String url = "jdbc:postgresql://" + env("PGHOST") + ":" + env("PGPORT") + "/"
                + env("PGDATABASE") + params;
        Properties props = new Properties();
        props.setProperty("user", env("PGUSER"));
        return DriverManager.getConnection(url, props);
    }

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null) {
            throw new IllegalStateException(name + " is not set");
        }
        return v;
    }

    static Object scalar(Connection conn, String sql) throws SQLException {
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            rs.next();
            return rs.getObject(1);
        }
    }

    /** INSERT ... RETURNING and getGeneratedKeys(), with the session's worker id and clock. */
    static Map<String, Object> single() throws SQLException {
        Map<String, Object> out = new LinkedHashMap<>();
        try (Connection conn = connect("")) {
            long before = System.currentTimeMillis();
            out.put("returning_id", Orders.insertReturning(conn, "returning"));
            out.put("generated_key_id", Orders.insertWithGeneratedKey(conn, "generated key"));
            long after = System.currentTimeMillis();
            out.put("before_ms", before);
            out.put("after_ms", after);
            out.put("worker_id", scalar(conn, "SELECT my_worker_id FROM snowflake_config()"));
        }
        return out;
    }

    /**
     * 10,000 rows one way: "batch" (getGeneratedKeys), "unnest" (insertAll)
     * or "prefetched" (insertBatchWithIds), on a connection with
     * reWriteBatchedInserts=true that logs its statements for the test.
     */
    static Map<String, Object> batch(String way) throws SQLException {
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> items = new ArrayList<>();
        for (int i = 0; i < 10_000; i++) {
            items.add(String.format("%s %05d", way, i));
        }
        try (Connection conn = connect("?reWriteBatchedInserts=true")) {
            try (Statement st = conn.createStatement()) {
                st.execute("SET log_statement = 'all'");
            }
            List<Long> ids;
            switch (way) {
                case "batch": ids = Orders.insertBatch(conn, items); break;
                case "unnest": ids = Orders.insertAll(conn, items); break;
                default: ids = Orders.insertBatchWithIds(conn, new SnowflakeIds(conn, 1000), items);
            }
            out.put("ids", ids);
            out.put("worker_id", scalar(conn, "SELECT my_worker_id FROM snowflake_config()"));
        }
        return out;
    }

    /** Two sessions in parallel threads, each with its own allocator; then one allocator shared by four threads. */
    static Map<String, Object> prefetch() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        ExecutorService pool = Executors.newFixedThreadPool(4);
        try (Connection a = connect(""); Connection b = connect(""); Connection c = connect("")) {
            List<Future<List<Long>>> sessions = new ArrayList<>();
            for (Connection conn : List.of(a, b)) {
                SnowflakeIds ids = new SnowflakeIds(conn, 1000);
                sessions.add(pool.submit(take(ids, 20_000)));
            }
            List<List<Long>> perSession = new ArrayList<>();
            for (Future<List<Long>> f : sessions) {
                perSession.add(f.get());
            }
            out.put("sessions", perSession);
            out.put("worker_ids", List.of(scalar(a, "SELECT my_worker_id FROM snowflake_config()"),
                    scalar(b, "SELECT my_worker_id FROM snowflake_config()")));

            SnowflakeIds shared = new SnowflakeIds(c, 1000);
            List<Future<List<Long>>> threads = new ArrayList<>();
            for (int t = 0; t < 4; t++) {
                threads.add(pool.submit(take(shared, 5_000)));
            }
            List<List<Long>> perThread = new ArrayList<>();
            for (Future<List<Long>> f : threads) {
                perThread.add(f.get());
            }
            out.put("shared_threads", perThread);
        } finally {
            pool.shutdown();
        }
        return out;
    }

    static Callable<List<Long>> take(SnowflakeIds ids, int n) {
        return () -> {
            List<Long> got = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                got.add(ids.next());
            }
            return got;
        };
    }

    /** What an ID costs each way, in ns per ID (printed by the test, never asserted). */
    static Map<String, Object> cost() throws SQLException {
        Map<String, Object> out = new LinkedHashMap<>();
        Set<Long> seen = new HashSet<>();
        int duplicates = 0;
        int notIncreasing = 0;
        try (Connection conn = connect("?reWriteBatchedInserts=true")) {
            // Warm up the JIT and the server-side prepared statements.
            SnowflakeIds warm = new SnowflakeIds(conn, 1000);
            for (int i = 0; i < 5_000; i++) {
                warm.next();
            }
            try (PreparedStatement ps = conn.prepareStatement("SELECT snowflake_nextval()")) {
                for (int i = 0; i < 200; i++) {
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                    }
                }
            }

            // 1. Prefetched in blocks of 1,000, handed out locally.
            int n = 200_000;
            SnowflakeIds ids = new SnowflakeIds(conn, 1000);
            long prev = 0;
            long t0 = System.nanoTime();
            for (int i = 0; i < n; i++) {
                long id = ids.next();
                if (id <= prev) {
                    notIncreasing++;
                }
                if (!seen.add(id)) {
                    duplicates++;
                }
                prev = id;
            }
            out.put("prefetch_1000_ns_per_id", (System.nanoTime() - t0) / (double) n);
            out.put("prefetch_ids", n);

            // 2. One SELECT snowflake_nextval() per ID.
            n = 5_000;
            t0 = System.nanoTime();
            try (PreparedStatement ps = conn.prepareStatement("SELECT snowflake_nextval()")) {
                for (int i = 0; i < n; i++) {
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        long id = rs.getLong(1);
                        if (id <= prev) {
                            notIncreasing++;
                        }
                        if (!seen.add(id)) {
                            duplicates++;
                        }
                        prev = id;
                    }
                }
            }
            out.put("nextval_per_id_ns_per_id", (System.nanoTime() - t0) / (double) n);
            out.put("nextval_ids", n);

            // 3. The column default, keys by getGeneratedKeys() in a batch of 10,000 rows.
            List<String> items = new ArrayList<>();
            for (int i = 0; i < 10_000; i++) {
                items.add("cost " + i);
            }
            t0 = System.nanoTime();
            List<Long> keys = Orders.insertBatch(conn, items);
            out.put("default_batch_generated_keys_ns_per_row", (System.nanoTime() - t0) / 10_000.0);
            check(keys, seen, prev);
            prev = keys.get(keys.size() - 1);

            // 4. The column default, 10,000 rows in one INSERT ... SELECT unnest(?) RETURNING id.
            t0 = System.nanoTime();
            keys = Orders.insertAll(conn, items);
            out.put("default_unnest_returning_ns_per_row", (System.nanoTime() - t0) / 10_000.0);
            check(keys, seen, prev);
            prev = keys.get(keys.size() - 1);

            // 5. Keys from the prefetched blocks in a rewritten batch of 10,000 rows.
            t0 = System.nanoTime();
            keys = Orders.insertBatchWithIds(conn, ids, items);
            out.put("prefetched_rewritten_batch_ns_per_row", (System.nanoTime() - t0) / 10_000.0);
            check(keys, seen, 0);
        }
        out.put("distinct_ids", seen.size());
        out.put("duplicates", duplicates + checkProblems[0]);
        out.put("not_increasing", notIncreasing + checkProblems[1]);
        return out;
    }

    static final int[] checkProblems = new int[2];

    /** Counts duplicates and keys not above the one before (from `after` on). */
    static void check(List<Long> keys, Set<Long> seen, long after) {
        long prev = after;
        for (long id : keys) {
            if (!seen.add(id)) {
                checkProblems[0]++;
            }
            if (id <= prev) {
                checkProblems[1]++;
            }
            prev = id;
        }
    }

    static String json(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof String) {
            return "\"" + ((String) v).replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
        }
        if (v instanceof Number || v instanceof Boolean) {
            return v.toString();
        }
        StringBuilder sb = new StringBuilder();
        if (v instanceof Map) {
            sb.append('{');
            String sep = "";
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                sb.append(sep).append(json(e.getKey().toString())).append(':').append(json(e.getValue()));
                sep = ",";
            }
            return sb.append('}').toString();
        }
        if (v instanceof List) {
            sb.append('[');
            String sep = "";
            for (Object o : (List<?>) v) {
                sb.append(sep).append(json(o));
                sep = ",";
            }
            return sb.append(']').toString();
        }
        throw new IllegalArgumentException("cannot write " + v.getClass());
    }
}
