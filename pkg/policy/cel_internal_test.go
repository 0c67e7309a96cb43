package policy

import "testing"

func TestAnalyze(t *testing.T) {
	env, err := celEnv()
	if err != nil {
		t.Fatal(err)
	}
	for expr, want := range map[string]bool{
		`has(args.amount) && double(args.amount) > 10.0 && args.path.startsWith("/srv/")`: true,
		`tool in ["a", "b"] || labels.env == "prod" || size(args.l) > 2`:                  true,
		`args.p.matches("^a+$") && args.?x.orValue(0) > 1 && !(agent == "x")`:             true,
		`args.p.lowerAscii().contains("drop") ? true : false`:                             true,
		`args.l.exists(x, x == 1)`:        false,
		`args.l.map(x, x * 2).size() > 0`: false,
		`args.p.split("/").size() > 3`:    false,
		`args.p.replace("a", "b") == ""`:  false,
	} {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("%s: %v", expr, iss.Err())
		}
		got, err := analyze(ast)
		if err != nil || got != want {
			t.Errorf("analyze(%s) = %v, %v; want %v", expr, got, err, want)
		}
	}
}
