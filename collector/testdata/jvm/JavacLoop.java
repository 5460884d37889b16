import java.io.File;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

// Compiles a source file again and again in this JVM, which keeps
// compiling javac's own code: a code cache of thousands of methods that
// changes all the time. Usage: JavacLoop SOURCE OUTDIR SECONDS
public class JavacLoop {
    public static void main(String[] args) {
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        long end = System.nanoTime() + Long.parseLong(args[2]) * 1_000_000_000L;
        while (System.nanoTime() < end) {
            if (javac.run(null, null, null, "-d", args[1], args[0]) != 0) {
                System.exit(1);
            }
        }
    }
}
