// A JDBC login (pgjdbc, Debian's libpostgresql-jdbc-java) to the cache server over TLS with
// SCRAM, run by tests/server/test_server_auth.py: prints the session's role and a read's rows, or the
// SQLSTATE of a refused login.
import java.sql.*;

public class JdbcLogin {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        try (Connection conn = DriverManager.getConnection(url, args[1], args[2]);
             Statement st = conn.createStatement()) {
            try (ResultSet rs = st.executeQuery("SELECT current_user")) {
                rs.next();
                System.out.println("user: " + rs.getString(1));
            }
            try (ResultSet rs = st.executeQuery(
                    "SELECT authorid, name FROM authors WHERE authorid = 1 CURRENCY BOUND 10 MIN")) {
                while (rs.next()) {
                    System.out.println("row: " + rs.getInt(1) + " " + rs.getString(2));
                }
            }
        } catch (SQLException exc) {
            System.out.println("error: " + exc.getSQLState());
        }
    }
}
