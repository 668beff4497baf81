// A JDBC application (pgjdbc, Debian's libpostgresql-jdbc-java) run against the cache server
// and against PostgreSQL directly by tests/server/test_server_clients.py, which compares what it
// prints: prepared statements (past pgjdbc's prepare threshold, so named and binary), a batch,
// metadata, a transaction that reads its own write, an error's SQLSTATE. With a third argument
// "cache" it also asks the server where the last rows came from (EXPLAIN LAST STATEMENT).
import java.math.BigDecimal;
import java.sql.*;

public class JdbcClient {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String user = args[1];
        boolean cache = args.length > 2 && args[2].equals("cache");
        try (Connection conn = DriverManager.getConnection(url, user, "")) {
            // prepared reads, 8 times: pgjdbc prepares server-side from the 5th
            try (PreparedStatement ps = conn.prepareStatement(
                    "SELECT isbn, title, price, authorid FROM books WHERE authorid = ? ORDER BY isbn")) {
                for (int round = 0; round < 8; round++) {
                    ps.setInt(1, 1 + round % 2);
                    try (ResultSet rs = ps.executeQuery()) {
                        StringBuilder line = new StringBuilder("read " + round + ":");
                        ResultSetMetaData md = rs.getMetaData();
                        for (int c = 1; c <= md.getColumnCount(); c++) {
                            line.append(" ").append(md.getColumnName(c)).append("/")
                                .append(md.getColumnTypeName(c));
                        }
                        while (rs.next()) {
                            BigDecimal price = rs.getBigDecimal(3);
                            line.append(" | ").append(rs.getString(1)).append(",")
                                .append(rs.getString(2)).append(",").append(price).append(",")
                                .append(rs.getInt(4));
                        }
                        System.out.println(line);
                    }
                }
            }
            if (cache) {
                try (Statement st = conn.createStatement();
                     ResultSet rs = st.executeQuery("EXPLAIN LAST STATEMENT")) {
                    while (rs.next()) {
                        System.out.println("cache: " + rs.getString("table") + " "
                                           + rs.getString("route") + " " + rs.getString("view"));
                    }
                }
            }
            // a batch into a temporary table, read back
            try (Statement st = conn.createStatement()) {
                st.execute("CREATE TEMP TABLE jdbc_batch (n integer, label text)");
            }
            try (PreparedStatement ps = conn.prepareStatement(
                    "INSERT INTO jdbc_batch VALUES (?, ?)")) {
                for (int i = 0; i < 50; i++) {
                    ps.setInt(1, i);
                    ps.setString(2, "row " + i);
                    ps.addBatch();
                }
                int total = 0;
                for (int count : ps.executeBatch()) total += count;
                System.out.println("batch: " + total);
            }
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT count(*), sum(n) FROM jdbc_batch")) {
                rs.next();
                System.out.println("batch read: " + rs.getLong(1) + " " + rs.getLong(2));
            }
            // metadata, as tools read it
            DatabaseMetaData meta = conn.getMetaData();
            try (ResultSet rs = meta.getColumns(null, "public", "books", null)) {
                StringBuilder line = new StringBuilder("columns:");
                while (rs.next()) {
                    line.append(" ").append(rs.getString("COLUMN_NAME")).append("/")
                        .append(rs.getString("TYPE_NAME"));
                }
                System.out.println(line);
            }
            try (ResultSet rs = meta.getPrimaryKeys(null, "public", "books")) {
                while (rs.next()) System.out.println("key: " + rs.getString("COLUMN_NAME"));
            }
            // a transaction that reads its own write, then rolls it back
            conn.setAutoCommit(false);
            try (Statement st = conn.createStatement()) {
                st.executeUpdate("UPDATE books SET price = price + 1 WHERE isbn = 'isbn-00002'");
                try (PreparedStatement ps = conn.prepareStatement(
                        "SELECT price FROM books WHERE isbn = ?")) {
                    ps.setString(1, "isbn-00002");
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        System.out.println("own write: " + rs.getBigDecimal(1));
                    }
                }
            }
            conn.rollback();
            conn.setAutoCommit(true);
            // an error, and the session goes on
            try (Statement st = conn.createStatement()) {
                st.executeQuery("SELECT no_such_column FROM books");
            } catch (SQLException e) {
                System.out.println("error: " + e.getSQLState());
            }
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT count(*) FROM books")) {
                rs.next();
                System.out.println("after error: " + rs.getLong(1));
            }
        }
    }
}
